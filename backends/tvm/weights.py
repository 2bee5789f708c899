"""The TVM artifact's weights: float tensors, and group-quantised 4-bit linears in the layout the
module's int4 kernel reads, the registered `tvm-q4` format (`arkinfer.quant.formats.tvm_q4` gives
every tensor's dtype, shape and the dequantisation): a linear weight `<owner>.weight` [N, K] is
stored as `<owner>.q4_codes` uint32 [N, K/8], `<owner>.q4_scales` [N, K/g] and, for asymmetric
weights, `<owner>.q4_zeros` uint8 [N, K/g]. Scales are fp16 where that is exact and fp32
otherwise (ORT's fp32 scales: never a silent rounding), so packing is lossless: the artifact
holds exactly the weights the recipe produced.

Float tensors keep their names: float matrices (embedding, a float lm_head) in the build's
`float_weights` dtype (float16 by default, like MLC-LLM's q4f16; float32 with
`--option float_weights=f32`), norms and biases as float32. The reference folder (reference.py)
is written from these stored values, so runtime fidelity compares the module with the reference
on exactly the same weights. `dequantize_q4` is the numpy reference of what the kernel computes.

    src = SourceWeights(model_dir)   # arkinfer.lowering.source_weights: a float folder or a
                                     # quantised one (any format)
    params, layers = program_params(program, src)        # the module's params, in its layout
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from arkinfer.quant.formats import FormatError
from arkinfer.quant.formats.scale_storage import exact_scale_dtype
from arkinfer.quant.formats.tvm_q4 import CODES, SCALES, SYM_ZERO, TVM_Q4, ZEROS
from arkinfer.quant.weight import QuantizedWeight

from arkinfer.errors import TargetError
from arkinfer.lowering.source_weights import SourceWeights

# the format's tensor keys and symmetric zero point, which reference.py, lower_relax.py and the
# kernels import from here
__all__ = ["CODES", "SCALES", "SYM_ZERO", "ZEROS", "dequantize_q4", "pack_q4", "program_params",
           "q4_names"]


def q4_names(weight_name: str) -> tuple[str, str, str]:
    """The packed tensors' names of a linear weight `<owner>.weight`."""
    owner = weight_name.removesuffix(".weight")
    return f"{owner}.{CODES}", f"{owner}.{SCALES}", f"{owner}.{ZEROS}"


def pack_q4(qw: QuantizedWeight) -> dict[str, np.ndarray]:
    """{"q4_codes", "q4_scales"[, "q4_zeros"]} of a canonical 4-bit weight (`TVM_Q4.pack`), the
    scales in fp16 when that is exact, else fp32.

    Raises TargetError for what the kernel cannot take (the format's refusal: other bit widths,
    act-order, a group size that does not split the row into whole 8-column words)."""
    try:
        return TVM_Q4.pack(qw, exact_scale_dtype(qw.scales.numpy()))
    except FormatError as e:
        raise TargetError(f"tvm int4 kernel: {e.message}", hint=e.hint) from e


def dequantize_q4(tensors: Mapping[str, np.ndarray], in_features: int) -> np.ndarray:
    """float32 [N, K]: the numpy reference of the kernel's dequantisation (`TVM_Q4.dequantize`;
    the group size is K / the scales' columns)."""
    scales = np.asarray(tensors[SCALES])
    return TVM_Q4.dequantize(tensors, scales.shape[0], in_features,
                             group_size=in_features // scales.shape[1])


def program_params(program, src: SourceWeights, float_dtype=np.float32
                   ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(params, layers): every weight the program's entry points read, in the module's argument
    order: linears stored quantised in `src` as their q4 tensors (pack_q4); float matrices
    (2-D: the embedding, float linears such as a tied lm_head) as `float_dtype`; the rest
    (norm weights, biases) as float32 (`rope.*` tables come from the program's own store: they
    are computed from the config). `layers` maps each linear to its storage, for the manifest."""
    params: dict[str, np.ndarray] = {}
    layers: dict[str, str] = {}
    linear_weights = {n.attrs["weight"] for g in program.entries.values() for n in g.nodes
                      if n.op == "linear"}
    names = sorted({w for g in program.entries.values() for w in g.weight_refs()})
    for name in names:
        shape = tuple(int(s) for s in program.weights[name].type.shape)
        qw = src.quantised(name, shape) if name in linear_weights else None
        if qw is not None:
            packed = pack_q4(qw)
            for key, names_ in zip((CODES, SCALES, ZEROS), q4_names(name)):
                if key in packed:
                    params[names_] = packed[key]
            scale_dtype = "fp16" if packed[SCALES].dtype == np.float16 else "fp32"
            layers[qw.name] = (f"q4 g{qw.group_size} {'sym' if ZEROS not in packed else 'asym'} "
                               f"({scale_dtype} scales)")
        elif name.startswith("rope."):
            params[name] = program.weights.tensor(name).to(torch.float32).numpy()
        else:
            params[name] = src.float32(name)
            if params[name].ndim == 2:
                params[name] = params[name].astype(float_dtype)
            if name in linear_weights:
                layers[name.removesuffix(".weight")] = params[name].dtype.name
            elif params[name].ndim == 2:
                layers[name.removesuffix(".weight")] = params[name].dtype.name
    return params, layers
