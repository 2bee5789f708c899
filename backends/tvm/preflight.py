"""What the TVM lowering can take, checked before any weight is read (plan and build).

- Quantised linears become `kernels_linear.linear_q4`: the formats and bits the backend
  declares (`Capabilities`: uniform 4-bit codes), static groups (no act-order), and every
  quantised linear's shape as the `tvm-q4` format (the layout the kernel reads) takes it: a
  group size that divides in_features and is a multiple of 8 (one uint32 word holds 8 codes).
  A layer that breaks a rule is named.
- Every IR op of the model must have an entry in `lower_relax.LOWERINGS`: the model is traced
  shape-only with ONE decoder layer (the same op set as the whole model, in about a second) and
  an op without a lowering is named with its nodes (`arkinfer.lowering.program_ops`).
- `sparse_config` (InfLLM v2): lowered (kernels_infllmv2.py), dense below dense_len and sparse
  from there on; `use_nope=true` is refused (the IR attention op carries no pre-RoPE q/k).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from arkinfer.backend import Capabilities
from arkinfer.errors import TargetError
from arkinfer.lowering.recipe_check import check_declared
from arkinfer.quant.formats.tvm_q4 import TVM_Q4


def check_recipe(raw_config: dict, recipe: Any, caps: Capabilities) -> None:
    """Raise TargetError naming the first linear the int4 kernel cannot take."""
    if recipe is None:
        return
    check_declared(recipe, caps, "tvm", stores="the int4 kernel's uniform codes",
                   hint="use --quant q4_0 (int4) or ort4")
    if recipe.calib == "ternary":
        raise TargetError(f"--quant {recipe.describe()}: the tvm backend's int4 kernel takes "
                          "uniform 4-bit weights", hint="use --quant q4_0 (int4) or ort4")
    from arkinfer.lowering.linears import linear_shapes

    bad = []
    for name, (out, inp) in linear_shapes(raw_config).items():
        if recipe.skips(name):
            continue
        why = TVM_Q4.shape_refusal(out, inp, bits=int(recipe.bits),
                                   group_size=int(recipe.group_size))
        if why is not None:
            bad.append((name, out, inp, why))
    if bad:
        name, out, inp, why = bad[0]
        pattern = sorted({re.sub(r"\.\d+\.", ".*.", b[0]) for b in bad})
        ok = [g for g in (32, 64, 128) if TVM_Q4.shape_refusal(out, inp, bits=int(recipe.bits),
                                                                group_size=g) is None]
        raise TargetError(f"{why} of '{name}' [{out}x{inp}], which the tvm int4 kernel reads as "
                          f"whole 8-code words ({len(bad)} layers: {', '.join(pattern)})",
                          hint=f"use group size {' or '.join(map(str, ok)) or 'a divisor of it'}")


def check_ops(raw_config: dict, passes: tuple[str, ...]) -> None:
    """Raise TargetError naming IR ops of the model that the TVM lowering does not cover."""
    from arkinfer import ir
    from arkinfer.lowering.program_ops import check_program_ops

    from .lower_relax import LOWERINGS

    one_layer = {**raw_config, "num_hidden_layers": 1}
    program = ir.run_passes(ir.trace(one_layer, dtype=torch.float32, shape_only=True), passes)
    check_program_ops(program, "TVM", LOWERINGS,
                      hint="build with another backend (arkinfer targets show TARGET lists them), "
                      "or add the op to backends/tvm/lower_relax.py LOWERINGS and to the tvm "
                      "backend's Capabilities.ops")


def preflight(raw_config: dict, recipe: Any, target: Any, dtype: str,
              passes: tuple[str, ...], caps: Capabilities) -> list[str]:
    if target is not None:
        target.check("tvm", recipe.format if recipe is not None else None, None)
    check_recipe(raw_config, recipe, caps)
    sparse = raw_config.get("sparse_config")
    if sparse and sparse.get("use_nope"):
        raise TargetError("sparse_config.use_nope=true is not supported by the tvm backend",
                          hint="use a config with use_nope=false")
    check_ops(raw_config, passes)
    notes = []
    if dtype in ("f16", "bf16"):
        notes.append(f"tvm: activations and float weights run in fp32 (the {dtype} build dtype "
                     "is not used by the module yet)")
    if sparse:
        notes.append(f"tvm: InfLLM v2 past dense_len={sparse.get('dense_len', 8192)} runs as TIR "
                     "kernels with masked-dense stage 2 (O(T*S) scores, not a block gather)")
    return notes
