"""`arkinfer bench`: llama-bench-style latency of an artifact's Runner on this machine.

Tests, for every context depth d in `depths`:
- `pp<p>` (n_prompt=p, n_gen=0): the cache is filled with d tokens (not timed), then p tokens are
  prefilled in one call; avg_ts = p / seconds. Its time is also the time to first token (TTFT)
  at that depth: the logits of the last prompt token are the first generated token's.
- `tg<n>` (n_prompt=0, n_gen=n): after d tokens of context, n single-token decode steps;
  avg_ts = n / seconds.
Each test runs `warmup` unmeasured times, then `repetitions` measured times; mean and standard
deviation are over the repetitions (llama-bench's `avg_ts`, `stddev_ts`, `samples_ts`, `avg_ns`,
...). Token ids are the artifact's own tokenisation of corpus_eval.txt, cycled, so every backend
sees the same text. Beside every measured rate, the latency model's prediction for this host
(`arkinfer.latency`, measured bandwidth and compute from `arkinfer doctor`) and measured/predicted.

`bench --speculative` adds, for every n in -n, a `spec-tg<n>` row: greedy decoding of SPEC_PROMPT
(a repetitive task) with and without a draft (`arkinfer.speculative`), interleaved, each run
checked to give the same tokens; n_depth is the prompt's length and avg_ts the speculative rate.
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from arkinfer.errors import ArkError, NotAvailableError
from arkinfer.huge_pages import status as huge_page_status
from arkinfer.targets.machine import cpu_features

# llama-bench's JSON fields we fill (same names and meaning), then ArkInfer's own.
LLAMA_BENCH_FIELDS = ("cpu_info", "backends", "model_filename", "model_type", "model_size",
                      "model_n_params", "n_threads", "n_prompt", "n_gen", "n_depth", "test_time",
                      "avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts")
OUR_FIELDS = ("test", "attention", "ttft_ms", "peak_rss_bytes", "predicted_ts",
              "measured_over_predicted", "target", "quant", "huge_page_malloc", "cpu_features",
              "runner_settings")


# Bounds checked when a BenchSpec is made (before anything is loaded or allocated): token counts,
# and depth + length, up to 16 Mi (the longest contexts of today's models; the cycled ids are
# then at most 128 MiB), and run counts a human would wait for. (flag, field, low, high)
MAX_TOKENS = 1 << 24
LIMITS = (("-p", "prompts", 0, MAX_TOKENS), ("-n", "gens", 0, MAX_TOKENS),
          ("-d", "depths", 0, MAX_TOKENS), ("-r", "repetitions", 1, 10_000),
          ("--warmup", "warmup", 0, 1_000))
RPC_TIMEOUT_S = 60.0  # default seconds each remote step (connect, upload, call) may take


@dataclass(frozen=True)
class BenchSpec:
    """What to measure; every number is range-checked here (ArkError naming the flag, the value
    and the allowed range). `rpc_timeout`: seconds each remote step may take (`bench --rpc`)."""

    prompts: tuple[int, ...] = (512,)
    gens: tuple[int, ...] = (128,)
    depths: tuple[int, ...] = (0,)
    repetitions: int = 5
    warmup: int = 1
    attention: tuple[str, ...] = ("default",)
    rpc_timeout: float = RPC_TIMEOUT_S

    def __post_init__(self) -> None:
        for flag, field, low, high in LIMITS:
            values = getattr(self, field)
            for v in values if isinstance(values, tuple) else (values,):
                if not low <= v <= high:
                    raise ArkError(f"{flag} {v} is outside the allowed range {low}..{high:,}",
                                   hint=f"pass {flag} between {low} and {high:,}")
        if not self.prompts or not self.gens or not self.depths:
            raise ArkError("-p, -n and -d each need at least one value", hint="e.g. -p 512 -n 128")
        if not any(self.prompts + self.gens):
            raise ArkError("-p and -n are all 0: at least one test needs a length above 0",
                           hint="e.g. -p 512 -n 128, or -p 0 -n 128 for generation only")
        self.check_context(MAX_TOKENS, "a bench")
        if not 0 < self.rpc_timeout <= 86_400:  # also false for NaN
            raise ArkError(f"--rpc-timeout {self.rpc_timeout} is not a number of seconds in "
                           "(0, 86400]", hint=f"e.g. --rpc-timeout {RPC_TIMEOUT_S:.0f}")

    @property
    def positions(self) -> int:
        """The most positions a test fills: depth, then a prompt, or the first token and the
        generated ones."""
        return max(self.depths) + max(max(self.prompts), max(self.gens) + 1)

    def check_context(self, context: int | None, where: str) -> None:
        """ArkError, naming the flags, when the tests need more positions than `context` (the
        most tokens `where` holds; None: unknown, not checked)."""
        if context is None or self.positions <= context:
            return
        raise ArkError(f"-d {max(self.depths)} with -p {max(self.prompts)} / -n "
                       f"{max(self.gens)} needs {self.positions:,} positions; {where} holds "
                       f"{context:,} tokens",
                       hint=f"pass -p, -n and -d values whose depth + length stay within "
                       f"{context:,}, e.g. -p {min(512, context // 2)} -n "
                       f"{min(128, context // 4)} -d 0")


def bench_tokens(runner, count: int) -> list[int]:
    """`count` token ids: the runner's tokenisation of corpus_eval.txt, cycled (`count` is
    bounded by BenchSpec's MAX_TOKENS)."""
    from .verify import (
        EVAL_TEXT,  # here: verify imports torch, and BenchSpec is checked first
    )

    ids = runner.tokenize(EVAL_TEXT.read_text(encoding="utf-8"))
    if not ids:
        raise ArkError("the artifact's tokenizer returned no tokens for the bench text",
                       hint="check the artifact's tokenizer files")
    return (ids * (count // len(ids) + 1))[:count]


def _time_pp(runner, context: list[int], prompt: list[int]) -> float:
    runner.reset()
    if context:
        runner.prefill(context)
    t0 = time.perf_counter()
    runner.prefill(prompt)
    return time.perf_counter() - t0


def _time_tg(runner, context: list[int], gen: list[int]) -> float:
    runner.reset()
    runner.prefill(context or gen[:1])
    t0 = time.perf_counter()
    for tok in gen:
        runner.decode(tok)
    return time.perf_counter() - t0


def run_bench(runner, manifest: dict[str, Any], spec: BenchSpec, *,
              predictor: Callable[[str, int, int, int, str], float | None] | None = None,
              progress: Callable[[str], None] | None = None,
              context: int | None = None) -> list[dict[str, Any]]:
    """One row per (attention, depth, test) with llama-bench's fields and ours. `context`: the
    most tokens the runner holds (`runner_context`); more is refused before any token is made."""
    from arkinfer.targets.machine import cpu_model

    spec.check_context(context, manifest["name"])
    need = max(spec.depths) + max(spec.prompts + spec.gens) + 1
    tokens = bench_tokens(runner, need)
    rows = []
    common = common_fields(manifest, cpu_model(), runner)
    for attention in spec.attention:
        use_attention(runner, manifest, attention)
        tests = [("pp", p) for p in spec.prompts if p > 0] + [("tg", n) for n in spec.gens if n > 0]
        for depth in spec.depths:
            context = tokens[:depth]
            for kind, size in tests:
                name = f"{kind}{size}" + (f" @ d{depth}" if depth else "")
                body = tokens[depth:depth + size]
                fn = _time_pp if kind == "pp" else _time_tg
                for i in range(spec.warmup):
                    if progress:
                        progress(f"{attention} {name}: warm-up {i + 1}/{spec.warmup}")
                    fn(runner, context, body)
                samples = []
                for i in range(spec.repetitions):
                    if progress:
                        progress(f"{attention} {name}: run {i + 1}/{spec.repetitions}")
                    samples.append(fn(runner, context, body))
                rows.append(bench_row(common, kind, size, depth, attention, samples, predictor))
    return rows


def use_attention(runner, manifest: dict[str, Any], attention: str) -> None:
    """Switch `runner` to `attention` ("dense" / "sparse"); "default" leaves it as loaded."""
    if attention == "default":
        return
    if attention not in runner.attention_modes:
        raise ArkError(f"--attention {attention}: backend {manifest['backend']['name']} "
                       "cannot switch attention", hint="use --attention default")
    runner.set_attention(attention)


def bench_row(common: dict[str, Any], kind: str, size: int, depth: int, attention: str,
              samples: list[float], predictor) -> dict[str, Any]:
    """One result row: `common` (from `common_fields`) plus the test's llama-bench fields and
    ours. `kind` "pp" or "tg", `size` its token count, `depth` the context before it;
    `samples` the measured seconds of each repetition; `predictor` (`host_predictor`) or None
    for no predicted rate. Remote benches (backends' `bench_remote`) build their rows here too."""
    ns = [int(s * 1e9) for s in samples]
    ts = [size / s for s in samples]
    avg_ts = statistics.fmean(ts)
    predicted = predictor(kind, size, depth, 0, attention) if predictor else None
    row = dict(common)
    row.update({
        "n_prompt": size if kind == "pp" else 0, "n_gen": size if kind == "tg" else 0,
        "n_depth": depth, "test_time": datetime.now(UTC).isoformat(timespec="seconds"),
        "avg_ns": int(statistics.fmean(ns)),
        "stddev_ns": int(statistics.stdev(ns)) if len(ns) > 1 else 0,
        "avg_ts": avg_ts, "stddev_ts": statistics.stdev(ts) if len(ts) > 1 else 0.0,
        "samples_ns": ns, "samples_ts": ts,
        "test": f"{kind}{size}", "attention": attention,
        "ttft_ms": statistics.fmean(samples) * 1e3 if kind == "pp" else None,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "predicted_ts": predicted,
        "measured_over_predicted": avg_ts / predicted if predicted else None,
    })
    return row


# `bench --speculative`'s default prompt: an edit that copies a given text almost word for word,
# so greedy decoding repeats the prompt and a prompt-lookup draft finds its next tokens there.
SPEC_NOTE = ("Dear neighbours, the river path will be closed from Monday to Thursday while the "
             "old bridge is repaired. Please use the north gate, park behind the library, and "
             "allow ten extra minutes for the walk to the station. ")
SPEC_PROMPT = (f"Edit the note: change Monday to Tuesday and keep every other word.\n"
               f"Note: {SPEC_NOTE}\nThe same note, copied: {SPEC_NOTE}\nEdited note: ")
# The fields a `spec-tg<n>` row adds to bench_row's (the other rows do not have them).
SPEC_FIELDS = ("draft", "draft_k", "plain_ts", "speedup", "mean_accepted_length",
               "acceptance_rate", "draft_s", "verify_s", "greedy_identical")


def speculative_gens(spec: BenchSpec) -> list[int]:
    """The -n lengths above 0, one `spec-tg<n>` row each; ArkError when there is none."""
    gens = [n for n in spec.gens if n > 0]
    if not gens:
        raise ArkError("--speculative times generation, and -n has no length above 0",
                       hint="e.g. --speculative -n 128")
    return gens


def speculative_prompt(runner, manifest: dict[str, Any], spec: BenchSpec,
                       context: int | None, text: str = SPEC_PROMPT) -> list[int]:
    """The token ids `run_speculative_bench` decodes after: `text` in the runner's tokenisation.
    Refuses, before anything is timed, a runner that cannot verify drafts (NotAvailableError),
    -n without a length above 0, and a prompt + n + 1 tokens beyond `context`."""
    if not runner.speculates:
        raise NotAvailableError(
            f"bench --speculative: the {manifest['backend']['name']} runtime of "
            f"{manifest['name']} cannot extend and truncate its KV cache, so it cannot verify "
            "drafts", hint="bench without --speculative, or build for a runtime that speculates "
            "(gguf, mlx, reference, onnx without InfLLM v2; docs/speculative.md)")
    gens = speculative_gens(spec)
    prompt = runner.tokenize(text)
    if not prompt:
        raise ArkError("the artifact's tokenizer returned no tokens for the speculative prompt",
                       hint="check the artifact's tokenizer files")
    need = len(prompt) + max(gens) + 1
    if context is not None and need > context:
        raise ArkError(f"--speculative -n {max(gens)} after its {len(prompt)}-token prompt needs "
                       f"{need:,} positions; {manifest['name']} holds {context:,} tokens",
                       hint=f"pass -n {max(1, context - len(prompt) - 1)} or less")
    return prompt


def _decode_seconds(tokens) -> tuple[list[int], float]:
    """(every id of the iterator `tokens`, seconds from its first id to its last): the first id
    comes from the prompt's prefill, which is not timed (as tg's context is not)."""
    out = [next(tokens)]
    t0 = time.perf_counter()
    out.extend(tokens)
    return out, time.perf_counter() - t0


def run_speculative_bench(runner, manifest: dict[str, Any], spec: BenchSpec, draft, k: int,
                          prompt: list[int], *,
                          progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One `spec-tg<n>` row per (attention, n in spec.gens above 0): after `prompt` (from
    `speculative_prompt`), n greedy tokens plainly (`plain_generate`) and speculatively with
    `draft` (an `arkinfer.speculative.Draft`, up to `k` tokens per verify step), interleaved,
    `warmup` + `repetitions` times. Every run must give the same tokens: a difference is an
    ArkError naming its first position. Rates exclude the prefill (see `_decode_seconds`)."""
    from arkinfer.speculative import SpecStats, plain_generate, speculative_generate
    from arkinfer.targets.machine import cpu_model

    from .verify_speculative import first_difference, greedy_mismatch, near_tie

    common = common_fields(manifest, cpu_model(), runner)
    rows = []
    for attention in spec.attention:
        use_attention(runner, manifest, attention)
        for n in speculative_gens(spec):
            runs, identical = [], True
            for i in range(spec.warmup + spec.repetitions):
                if progress:
                    what = (f"warm-up {i + 1}/{spec.warmup}" if i < spec.warmup else
                            f"run {i - spec.warmup + 1}/{spec.repetitions}")
                    progress(f"{attention} spec-tg{n}: {what}")
                # n + 1 ids: the prefill's untimed one, then n timed like tg<n>'s decode steps
                plain, plain_s = _decode_seconds(plain_generate(runner, prompt, n + 1))
                stats = SpecStats()
                fast, spec_s = _decode_seconds(speculative_generate(
                    runner, draft, prompt, n + 1, k=k, stats=stats))
                mismatch = greedy_mismatch(plain, fast)
                if mismatch and near_tie(runner, prompt, plain, fast,
                                         first_difference(plain, fast)) is not None:
                    identical = False  # a near tie the runtime's kernels order differently
                elif mismatch:
                    raise ArkError(f"greedy speculative decoding of {manifest['name']} ({draft.name}"
                                   f", k={k}) differs from plain greedy decoding: {mismatch}",
                                   hint="a bug in the runtime's extend/truncate or in the "
                                   "acceptance rule; report it with the artifact")
                if i >= spec.warmup:
                    runs.append((plain_s, spec_s, stats))
            rows.append(speculative_row(common, n, len(prompt), attention, runs, draft.name, k,
                                        identical))
    return rows


def speculative_row(common: dict[str, Any], n: int, prompt_tokens: int, attention: str,
                    runs: list, draft: str, k: int, identical: bool = True) -> dict[str, Any]:
    """bench_row's fields for the speculative runs (avg_ts: speculative tokens/s, n_depth: the
    prompt) plus SPEC_FIELDS. `runs`: (plain seconds, speculative seconds, SpecStats) per
    measured repetition, each over n tokens."""
    row = bench_row(common, "tg", n, prompt_tokens, attention, [s for _, s, _ in runs], None)
    plain_ts = statistics.fmean(n / p for p, _, _ in runs)
    stats = [st for _, _, st in runs]
    row.update({
        "test": f"spec-tg{n}", "draft": draft, "draft_k": k, "plain_ts": plain_ts,
        "speedup": row["avg_ts"] / plain_ts,
        "mean_accepted_length": statistics.fmean(st.mean_accepted_length for st in stats),
        "acceptance_rate": statistics.fmean(st.acceptance_rate for st in stats),
        "draft_s": statistics.fmean(st.draft_s for st in stats),
        "verify_s": statistics.fmean(st.verify_s for st in stats),
        # False only for a near tie the runtime's kernels order differently
        # (verify_speculative.near_tie); run_speculative_bench raises for any other difference
        "greedy_identical": identical,
    })
    return row


def common_fields(manifest: dict[str, Any], cpu: str, runner: Any = None) -> dict[str, Any]:
    """The fields every row of one bench shares, from the artifact's manifest; `cpu` names the
    machine that ran it (llama-bench's cpu_info), `cpu_features` its SIMD flags,
    `runner_settings` the runtime settings the runner chose ({} when it has none to report;
    onnx: its MatMulNBits accuracy level)."""
    import torch

    return {"cpu_info": cpu, "backends": manifest["backend"]["name"],
            "model_filename": manifest["name"], "model_type": manifest["source"]["architecture"],
            "model_size": manifest["memory"]["weights_bytes"],
            "model_n_params": manifest.get("source", {}).get("n_params"),
            "n_threads": torch.get_num_threads(), "target": manifest["target"]["id"],
            "quant": manifest["quant"]["scheme"],
            "huge_page_malloc": huge_page_status()["on"], "cpu_features": cpu_features(),
            "runner_settings": dict(getattr(runner, "settings", None) or {})}


def host_predictor(manifest: dict[str, Any], raw_config: dict[str, Any]):
    """A predictor(kind, size, depth, _, attention) -> tokens/s for this host, or None when the
    latency model is not available."""
    try:
        from arkinfer.latency import ModelCost, host_target, predict
    except ImportError:
        return None
    host = host_target(measure_if_missing=True)
    from .manifest import recipe_of

    cost = ModelCost.from_config(raw_config, quant=recipe_of(manifest) or manifest["quant"]["scheme"])

    def predictor(kind: str, size: int, depth: int, _unused: int, attention: str) -> float | None:
        mode = "sparse" if attention in ("sparse", "default") and raw_config.get("sparse_config") \
            else "dense"
        if kind == "pp":
            p = predict(cost, host, ctx=depth + size, prompt=size, attention=mode)
            return p.prefill_tok_s
        p = predict(cost, host, ctx=depth + size // 2, prompt=0, attention=mode)
        return p.decode_tok_s

    return predictor


def write_plot(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    """tokens/s against context depth: prompt processing (left) and generation (right), one line
    per (test, attention) with the standard deviation as error bars; PNG (or SVG/PDF by the
    extension), written exactly at `path` (`arkinfer.plot_file`). Returns the path written."""
    from arkinfer.plot_file import check_plot_path, save_figure

    check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), dpi=120)
    for ax, kind, name in ((axes[0], "pp", "prompt processing"), (axes[1], "tg", "generation")):
        series: dict[str, list[tuple[int, float, float]]] = {}
        for r in rows:
            if not r["test"].startswith(kind):
                continue
            label = r["test"] + ("" if r["attention"] == "default" else f" ({r['attention']})")
            series.setdefault(label, []).append((r["n_depth"], r["avg_ts"], r["stddev_ts"]))
        for label, pts in series.items():
            pts.sort()
            xs, ys, es = zip(*pts)
            ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=label)
        ax.set_title(name)
        ax.set_xlabel("context depth (tokens already in the KV cache)")
        ax.set_ylabel("tokens / s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if series:
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    try:
        return save_figure(fig, path)
    finally:
        plt.close(fig)
