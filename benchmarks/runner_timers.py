"""Timers of a Runner for the benchmark scripts: prompt processing and token generation.

    pp, tg = runner_timers(runner, tokens)
    pp(n)   # seconds to prefill tokens[:n] from an empty cache
    tg(n)   # seconds to decode tokens[1:1+n] one by one after a 1-token prefill
"""

from __future__ import annotations

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
