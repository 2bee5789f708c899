"""The program a backend lowers: the one build traced, or the model traced now.

    program = program_of(request, src.raw, entries=("prefill",))     # onnx, coreml
    program = program_of(request, request.source_dir, passes=BACKEND_PASSES)   # tvm

build traces once and hands the program over (`LowerRequest.program`, after the backend's
`ir_passes`); a caller of `Backend.lower` that did not trace (a test, a benchmark) leaves it None
and the backend traces here, the way build does: shape-only (config.json alone, no weight read),
fp32 types, then `passes`.
"""

from __future__ import annotations

from typing import Any

import torch

from arkinfer import ir
from arkinfer.backend import LowerRequest
from arkinfer.ir.graph import ENTRY_POINTS, Program


def program_of(request: LowerRequest, source: Any, *, passes: tuple[str, ...] = (),
               entries: tuple[str, ...] = ENTRY_POINTS) -> Program:
    """`request.program`, or `source` (a model folder, or a config.json dict) traced shape-only
    in fp32 for `entries` and run through `passes` when the request carries none."""
    if request.program is not None:
        return request.program
    request.progress(f"tracing the IR ({', '.join(entries)}; symbolic lengths)")
    program = ir.trace(source, dtype=torch.float32, shape_only=True, entries=entries)
    return ir.run_passes(program, passes)
