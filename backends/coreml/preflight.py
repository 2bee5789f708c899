"""What the Core ML lowering can take, checked before any weight is read (plan time).

- Quantised linears become `constexpr_blockwise_shift_scale` carrying the canonical codes:
  formats whose canonical weights have integer zero points, static groups and fp16 scales, 4 or
  8 bits, no act-order (a non-static g_idx has no block layout): the backend's `Capabilities`.
- Every IR op the model traces to must have a conversion (`program.CONVERSIONS`); the IR is
  traced from config.json alone (shape only, no weights), so an op without a conversion is an
  error naming it and its nodes here (`arkinfer.lowering.program_ops`), not after calibration.
- `sparse_config.use_nope=true` (selection on pre-RoPE q / k) has no conversion yet.
"""

from __future__ import annotations

from typing import Any

from arkinfer.backend import Capabilities
from arkinfer.errors import TargetError
from arkinfer.lowering.program_ops import check_program_ops, raise_undeclared
from arkinfer.lowering.recipe_check import check_declared

HINT = ("backends/coreml/program.py CONVERSIONS lists the converted ops; use another backend "
        "for this model (e.g. --backend gguf)")


def check_recipe(recipe: Any, caps: Capabilities) -> None:
    """Raise TargetError unless the recipe's format, bits and act-order are declared in `caps`."""
    check_declared(recipe, caps, "coreml", stores="constexpr_blockwise_shift_scale",
                   hint="use --quant int4 (gptq), gptq, awq or q4_0")


def check_ops(raw_config: dict) -> None:
    """Trace the IR from config.json (shape only) and raise naming every op without a
    conversion (`program.CONVERSIONS`)."""
    import torch

    from arkinfer import ir

    from .program import CONVERSIONS

    if (raw_config.get("sparse_config") or {}).get("use_nope"):
        raise TargetError("sparse_config.use_nope=true (InfLLM v2 selection on pre-RoPE q / k) "
                          "has no Core ML conversion yet", hint="use a config with use_nope=false")
    program = ir.trace(raw_config, dtype=torch.float32, shape_only=True, entries=("prefill",))
    check_program_ops(program, "Core ML", CONVERSIONS, hint=HINT)


def raise_unconverted(missing: dict[str, list[str]]) -> None:
    """Raise TargetError naming the ops of `program.unconverted_ops` (op -> nodes), if any."""
    raise_undeclared(missing, "Core ML", HINT)
