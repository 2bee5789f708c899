"""Pass `fuse_gate_up`: one `gate_up_proj` linear (rows Wgate|Wup) per MLP."""

from __future__ import annotations

from arkinfer.ir.graph import Program
from arkinfer.ir.passes._fuse_linears import fuse_linears


def fuse_gate_up(program: Program) -> Program:
    """gate_proj and up_proj of one MLP reading the same value -> gate_up_proj + 2 slices."""
    return fuse_linears(program, ("gate_proj", "up_proj"), "gate_up_proj")
