"""Graph passes: one small file each; `run_passes` runs the verifier after every one.

    fuse_qkv          q/k/v projections reading one value -> one linear on qkv_proj + 3 slices
    fuse_gate_up      gate/up projections -> one linear on gate_up_proj + 2 slices
    fold_rope_tables  rope(x, pos; inv_freq, scale) -> rope_table(x, pos; cos|sin table [max_len, D])
    dce               drop nodes no output needs, then weights no entry point reads

A pass takes a Program and returns a new one (graphs copied, weight data shared); the input
program stays valid, so a pass can be compared against its input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from arkinfer.ir.errors import IRError
from arkinfer.ir.graph import Program
from arkinfer.ir.passes.dce import dce
from arkinfer.ir.passes.fold_rope_tables import fold_rope_tables
from arkinfer.ir.passes.fuse_gate_up import fuse_gate_up
from arkinfer.ir.passes.fuse_qkv import fuse_qkv
from arkinfer.ir.verify import verify

Pass = Callable[[Program], Program]
PASSES: dict[str, Pass] = {
    "fuse_qkv": fuse_qkv,
    "fuse_gate_up": fuse_gate_up,
    "fold_rope_tables": fold_rope_tables,
    "dce": dce,
}
DEFAULT_PIPELINE: tuple[str, ...] = ("fuse_qkv", "fuse_gate_up", "fold_rope_tables", "dce")


def run_passes(program: Program, names: Sequence[str] = DEFAULT_PIPELINE) -> Program:
    """Apply the named passes in order, verifying after each one."""
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise IRError(f"unknown pass(es) {unknown}", hint=f"passes: {', '.join(PASSES)}")
    for name in names:
        program = verify(PASSES[name](program), after=name)
    return program


__all__ = [
    "DEFAULT_PIPELINE",
    "PASSES",
    "dce",
    "fold_rope_tables",
    "fuse_gate_up",
    "fuse_qkv",
    "run_passes",
]
