"""Pass `fuse_qkv`: one `qkv_proj` linear (rows Wq|Wk|Wv, biases too for Qwen2) per attention."""

from __future__ import annotations

from arkinfer.ir.graph import Program
from arkinfer.ir.passes._fuse_linears import fuse_linears


def fuse_qkv(program: Program) -> Program:
    """q_proj, k_proj, v_proj of one layer reading the same normed hidden -> qkv_proj + 3 slices."""
    return fuse_linears(program, ("q_proj", "k_proj", "v_proj"), "qkv_proj")
