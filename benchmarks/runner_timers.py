"""Timers of a Runner for the benchmark scripts: prompt processing and token generation.

    pp, tg = runner_timers(runner, tokens)
    pp(n)   # seconds to prefill tokens[:n] from an empty cache
    tg(n)   # seconds to decode tokens[1:1+n] one by one after a 1-token prefill

    samples = interleaved_rates({"ours": (pp, tg), ...}, repetitions=3, n_prompt=512, n_gen=128)
    rows = rate_rows(samples)     # [{"test": "pp512", "ours_ts": mean, "ours_stddev", ...}, ...]
"""

from __future__ import annotations

import statistics
import time


def runner_timers(runner, tokens: list[int]):
    def pp(n: int) -> float:
        runner.reset()
        t0 = time.perf_counter()
        runner.prefill(tokens[:n])
        return time.perf_counter() - t0

    def tg(n: int) -> float:
        runner.reset()
        runner.prefill(tokens[:1])
        t0 = time.perf_counter()
        for tok in tokens[1:1 + n]:
            runner.decode(tok)
        return time.perf_counter() - t0

    return pp, tg


def interleaved_rates(runs: dict, repetitions: int, n_prompt: int, n_gen: int,
                      tests: tuple[str, str] = ("pp512", "tg128")) -> dict:
    """{run: {pp test: [tokens/s], tg test: [tokens/s]}}: every run's pp(n_prompt) and tg(n_gen)
    once per repetition, the runs interleaved rep by rep (a drifting machine load hits all of
    them alike); each repetition is printed as it finishes. runs: {name: (pp, tg)}, timers
    called with no argument that time n_prompt / n_gen tokens."""
    pp_name, tg_name = tests
    samples = {name: {pp_name: [], tg_name: []} for name in runs}
    for i in range(repetitions):
        for name, (pp, tg) in runs.items():
            samples[name][pp_name].append(n_prompt / pp())
            samples[name][tg_name].append(n_gen / tg())
        print(f"rep {i + 1}: " + " | ".join(
            f"{name} pp {s[pp_name][-1]:.2f} tg {s[tg_name][-1]:.2f}"
            for name, s in samples.items()), flush=True)
    return samples


def rate_rows(samples: dict) -> list[dict]:
    """[{"test", "<run>_ts" (mean), "<run>_stddev", "<run>_samples"}] per test of `samples`."""
    tests = next(iter(samples.values())).keys()
    rows = []
    for test in tests:
        row = {"test": test}
        for name, s in samples.items():
            row[f"{name}_ts"] = statistics.fmean(s[test])
            row[f"{name}_stddev"] = statistics.stdev(s[test]) if len(s[test]) > 1 else 0.0
            row[f"{name}_samples"] = s[test]
        rows.append(row)
    return rows
