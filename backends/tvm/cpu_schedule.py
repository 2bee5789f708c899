"""Schedules of the host (llvm) build: dlight's CPU rules plus two small rules of ours, applied
with `dlight.ApplyDefaultSchedule` after the CPU default pipeline's legalisation and fusion
(`compile.schedule` calls `host_rules(target)` for llvm targets).

    LinearRows    every linear (the int4 GEMV/GEMM `q4_linear` and the float `linear`): split the
                  reduction k into k_o x 8 and rfactor the 8 lanes, so LLVM sees 8 independent
                  fp32 partial sums (one AVX2 vector: the 8 nibbles of one packed uint32 word
                  decode in parallel, x[k] loads contiguously); output rows in parallel over the
                  target's num-cores; the 8 partial sums are added per row at the end.
    dlight.cpu.Reduction  softmax / rms_norm style functions (parallel rows, vector epilogues).
    ParallelRows  anything else: the outer spatial loops fused and run in parallel.

Summation order: a linear's dot product is 8 interleaved partial sums (k = 8*k_o + lane) added
lane by lane, not the serial k order of the unscheduled loop; results differ from it by fp32
rounding only (the tests compare with the interpreter at 1e-4).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

LANES = 8  # fp32 lanes of one AVX2 register; also the nibbles of one packed q4 word
LINEAR_BLOCKS = ("q4_linear", "linear")


def _static(extent) -> int | None:
    return int(extent) if isinstance(extent, (int, tirx.IntImm)) else None


def _block_named(sch: s_tir.Schedule, names: tuple[str, ...]):
    for name in names:
        try:
            return sch.get_sblock(name)
        except Exception:  # noqa: BLE001 - tvm raises a plain error for a missing block
            continue
    return None


class LinearRows(dl.ScheduleRule):
    """The linears of kernels_linear.py (see the module doc)."""

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        block = _block_named(sch, LINEAR_BLOCKS)
        if block is None:
            return None
        loops = sch.get_loops(block)
        *spatial, k = loops
        k_len = _static(sch.get(k).extent)
        if not spatial or k_len is None or k_len % LANES:
            return None
        k_outer, lanes = sch.split(k, factors=[None, LANES])
        partial = sch.rfactor(lanes, factor_axis=len(spatial))
        # partial: loops (*spatial, k_outer, lanes) -> put the lanes innermost and vectorise
        p_loops = sch.get_loops(partial)
        sch.reorder(*p_loops[:len(spatial)], p_loops[-2], p_loops[-1])
        sch.vectorize(sch.get_loops(partial)[-1])
        rows = sch.fuse(*sch.get_loops(partial)[:len(spatial)])
        sch.parallel(rows)
        sch.set_scope(partial, 0, "local")  # 8 partial sums per row, kept in a register
        sch.decompose_reduction(partial, sch.get_loops(partial)[-2])
        return sch


class ParallelRows(dl.ScheduleRule):
    """Fallback: the leading spatial loops of every block fused and parallel (LLVM vectorises
    what it can inside)."""

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        infos = dl.analysis.normalize_prim_func(sch)
        if infos is None:
            return None
        changed = False
        for info in infos:
            kinds = info.dom_kind()
            lead = len(kinds) - len(kinds.lstrip("S"))
            loops = sch.get_loops(info.block_rv)
            if lead == 0 or len(loops) < lead:
                continue
            sch.parallel(sch.fuse(*loops[:lead]) if lead > 1 else loops[0])
            changed = True
        return sch if changed else None


def host_rules() -> list[dl.ScheduleRule]:
    """The rules, in the order ApplyDefaultSchedule tries them (first match wins)."""
    return [LinearRows(), dl.cpu.Reduction(), ParallelRows()]


SCHEDULE_NOTE = ("llvm (num-cores = this machine's cores): linears rfactored over 8 fp32 lanes "
                 "(AVX2), rows parallel (cpu_schedule.LinearRows); dlight.cpu.Reduction for "
                 "softmax / rms_norm; other loops fused and parallel (cpu_schedule.ParallelRows)")
