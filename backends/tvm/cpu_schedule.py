"""Schedules of the host (llvm) build: dlight's CPU rules plus small rules of ours, applied
with `dlight.ApplyDefaultSchedule` after the CPU default pipeline's legalisation and fusion
(`default_pipeline.schedule` calls `host_rules(target)` for llvm targets; first match wins).

    LinearRows    every reduction over a contiguous last axis: the int4 `q4_linear` (its
                  (word, lane) axes), the float `linear` (k split into k_o x 8) and the
                  attention scores `attn_qk`. The 8 lanes x ACCUMULATORS consecutive words are
                  rfactored into 32 partial sums per row, run as 4 unrolled AVX2 vectors
                  (independent FMA chains; for q4 one packed uint32 word decodes into one
                  vector with variable shifts); output rows in parallel over the target's
                  num-cores; the partial sums are added per row at the end.
    MixRows       `attn_pv` (probabilities x V): rows in parallel, the key loop outside the
                  contiguous head-dim loop (one row of V per key, vectorised by LLVM).
    NormRows      kernels_norm.rms_norm: rows in parallel, each row's sum of squares once.
    dlight.cpu.Reduction  softmax (parallel rows, vector epilogues).
    SmallSerial   (tried first) a function with static loops and < SMALL_WORK iterations:
                  left serial (the thread pool's wake-up costs more than its work).
    ParallelRows  anything else: the spatial loops outside the innermost one fused and run in
                  parallel; the innermost stays a plain contiguous loop (vectorised by LLVM).

The host module's prefill linears never reach these rules: kernels_gemm.py's tiled GEMMs
arrive scheduled (`tirx.is_scheduled`), like decode's hand-built GEMVs. LinearRows still takes
the TE linears that remain (a float lm_head in decode, shapes the GEMVs refuse, the portable
module compiled for llvm in tests) and the attention scores.

Measured per kernel on SmolLM2-135M's decode step (these rules replaced dlight's CPU Reduction
for rms_norm, which recomputed a row's sum once per element, and a fused-everything parallel
loop for the KV-cache concat, which divided per element).

Summation order: a dot product is 32 interleaved partial sums (k = 32*k_o + 8*chain + lane)
added at the end, not the serial k order of the unscheduled loop; results differ from it by
fp32 rounding only (the tests compare with the interpreter at 1e-4).
"""

from __future__ import annotations

import numpy as np
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

LANES = 8  # fp32 lanes of one AVX2 register; also the nibbles of one packed q4 word
SMALL_WORK = 8192  # loop iterations below which a function runs serial (SmallSerial)
ACCUMULATORS = 4  # independent vector sums per row: an FMA's latency (4-5 cycles) is not the
#                   loop's bound
LINEAR_BLOCKS = ("q4_linear", "q8_linear", "linear", "attn_qk")   # reductions over a contiguous last axis
MIX_BLOCKS = ("attn_pv",)                             # reductions whose output axis is contiguous


def _static(extent) -> int | None:
    return int(extent) if isinstance(extent, (int, tirx.IntImm)) else None


def _block_named(sch: s_tir.Schedule, names: tuple[str, ...]):
    for name in names:
        try:
            return sch.get_sblock(name)
        except Exception:  # noqa: BLE001 - tvm raises a plain error for a missing block
            continue
    return None


def _llvm_schedule(func, target: Target) -> s_tir.Schedule | None:
    """A schedule of `func` when it is a PrimFunc built for llvm (the rules' common first step)."""
    if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
        return None
    return s_tir.Schedule(func)


def _llvm_block(func, target: Target, names: tuple[str, ...]):
    """(schedule, block) of the first block named in `names`, for llvm PrimFuncs; else None."""
    sch = _llvm_schedule(func, target)
    block = None if sch is None else _block_named(sch, names)
    return None if block is None else (sch, block)


def _llvm_blocks(func, target: Target):
    """(schedule, dlight's normalised block infos) for llvm PrimFuncs dlight can analyse."""
    sch = _llvm_schedule(func, target)
    infos = None if sch is None else dl.analysis.normalize_prim_func(sch)
    return None if infos is None else (sch, infos)


class LinearRows(dl.ScheduleRule):
    """The linears of kernels_linear.py (see the module doc)."""

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool):
        found = _llvm_block(func, target, LINEAR_BLOCKS)
        if found is None:
            return None
        sch, block = found
        loops = sch.get_loops(block)
        kinds = dl.analysis.get_sblock_info(sch, block).dom_kind()   # e.g. "SSSR" / "SSSRR"
        n_red = len(kinds) - len(kinds.rstrip("R"))
        if len(kinds) != len(loops) or n_red not in (1, 2) or n_red == len(loops):
            return None
        spatial = loops[:-n_red]
        if n_red == 2:   # (word, lane) of kernels_linear.linear_q4: the lanes are the 8 sums
            k_outer, lanes = loops[-2:]
            if _static(sch.get(lanes).extent) != LANES:
                return None
        else:            # one reduction axis k: split it into k_outer x 8 lanes
            k_len = _static(sch.get(loops[-1]).extent)
            if k_len is None or k_len % LANES:
                return None
            k_outer, lanes = sch.split(loops[-1], factors=[None, LANES])
        chains = ACCUMULATORS if (_static(sch.get(k_outer).extent) or 1) % ACCUMULATORS == 0 \
            and sch.get(block).name_hint != "attn_qk" else 1   # attn_qk: short rows (head dim)
        if chains > 1:   # ACCUMULATORS consecutive words go to separate partial sums
            k_outer, k_chain = sch.split(k_outer, factors=[None, chains])
            lanes = sch.fuse(k_chain, lanes)
        partial = sch.rfactor(lanes, factor_axis=len(spatial))
        # partial: loops (*spatial, k_outer, chains*lanes) -> the sums innermost, as
        # `chains` unrolled vectors of 8 lanes (independent FMA chains)
        p_loops = sch.get_loops(partial)
        sch.reorder(*p_loops[:len(spatial)], p_loops[-2], p_loops[-1])
        sums = sch.get_loops(partial)[-1]
        chain, lane = sch.split(sums, factors=[chains, LANES])
        sch.vectorize(lane)
        if chains > 1:
            sch.unroll(chain)
        rows = sch.fuse(*sch.get_loops(partial)[:len(spatial)])
        sch.parallel(rows)
        sch.set_scope(partial, 0, "local")  # chains x 8 partial sums per row, in registers
        sch.decompose_reduction(partial, sch.get_loops(partial)[-3])
        return sch


class MixRows(dl.ScheduleRule):
    """attn_pv (p [.., S] x v [S, D] -> [.., D]): the output rows in parallel, the reduction j
    outside the contiguous output axis d, which is vectorised (one row of V per j)."""

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool):
        found = _llvm_block(func, target, MIX_BLOCKS)
        if found is None:
            return None
        sch, block = found
        *rows, d, j = sch.get_loops(block)
        if not rows or _static(sch.get(d).extent) is None:
            return None
        sch.parallel(sch.fuse(*rows) if len(rows) > 1 else rows[0])
        sch.reorder(j, d)
        init = sch.decompose_reduction(block, j)
        sch.vectorize(sch.get_loops(init)[-1])
        # the update's d loop is left to LLVM's loop vectoriser (TIR refuses to vectorise a
        # reduction block whose reduction loop j sits outside it)
        return sch


class NormRows(dl.ScheduleRule):
    """kernels_norm.rms_norm: rows in parallel (when there is more than one), each row's sum of
    squares computed once under its row, then the row's epilogue."""

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool):
        sch = _llvm_schedule(func, target)
        if sch is None:
            return None
        ssq, out = _block_named(sch, ("rms_ssq",)), _block_named(sch, ("rms_norm",))
        if ssq is None or out is None:
            return None
        *rows, _width = sch.get_loops(out)
        if not rows:
            return None
        row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
        sch.compute_at(ssq, row)
        if _static(sch.get(row).extent) != 1:
            sch.parallel(row)
        return sch


class SmallSerial(dl.ScheduleRule):
    """A function with static loops and little work (decode's reshapes, transposes, RoPE of one
    token, a one-row rms_norm): left serial. Waking the thread pool costs 4-7 us per call on this
    machine, more than such a kernel's work, and a decode step calls ~100 of them."""

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool):
        found = _llvm_blocks(func, target)
        if found is None:
            return None
        sch, infos = found
        work = 0
        for info in infos:
            extents = [_static(sch.get(loop).extent) for loop in sch.get_loops(info.block_rv)]
            if None in extents:
                return None
            work += int(np.prod(extents)) if extents else 1
        return sch if work <= SMALL_WORK else None


class ParallelRows(dl.ScheduleRule):
    """Fallback: the leading spatial loops of every block fused and parallel (LLVM vectorises
    what it can inside)."""

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool):
        found = _llvm_blocks(func, target)
        if found is None:
            return None
        sch, infos = found
        changed = False
        for info in infos:
            kinds = info.dom_kind()
            lead = len(kinds) - len(kinds.lstrip("S"))
            loops = sch.get_loops(info.block_rv)
            if lead == 0 or len(loops) < lead:
                continue
            # the innermost spatial loop stays whole (contiguous: LLVM vectorises it, and no
            # division per element); the ones outside it are fused and run in parallel
            outer = loops[:lead - 1] if lead > 1 else loops[:1]
            sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
            changed = True
        return sch if changed else None


def host_rules() -> list[dl.ScheduleRule]:
    """The rules, in the order ApplyDefaultSchedule tries them (first match wins)."""
    return [SmallSerial(), LinearRows(), MixRows(), NormRows(), dl.cpu.Reduction(),
            ParallelRows()]


SCHEDULE_NOTE = ("llvm (num-cores = this machine's cores): prefill linears as a tiled GEMM "
                 "(6 x 16 fp32 register tile, weight panels decoded once per call, panels "
                 "parallel: kernels_gemm.py); other linears and attention scores "
                 "rfactored into 4 x 8 fp32 lanes (AVX2), rows parallel (cpu_schedule.LinearRows); "
                 "attention mix with the head dim innermost (MixRows); rms_norm per row "
                 "(NormRows); dlight.cpu.Reduction for softmax; other loops parallel outside "
                 "their innermost loop (ParallelRows)")
