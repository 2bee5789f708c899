"""The TVM artifact's weights: float tensors, and group-quantised 4-bit linears in the layout the
module's int4 kernel reads, the registered `tvm-q4` format (`arkinfer.quant.formats.tvm_q4` gives
every tensor's dtype, shape and the dequantisation): a linear weight `<owner>.weight` [N, K] is
stored as `<owner>.q4_codes` uint32 [N, K/8], `<owner>.q4_scales` [N, K/g] and, for asymmetric
weights, `<owner>.q4_zeros` uint8 [N, K/g]. Scales are fp16 where that is exact and fp32
otherwise (ORT's fp32 scales: never a silent rounding), so packing is lossless: the artifact
holds exactly the weights the recipe produced.

Float matrices (the embedding, a float lm_head, tied or not) are stored in the build's
`float_weights` form: `q8` (the default) as llama.cpp's Q8_0, `<owner>.q8_codes` int8 [N, K]
and `<owner>.q8_scales` fp16 [N, K/32] with W[n, k] = scales[n, k // 32] * codes[n, k]
(`pack_q8`: per block of 32, d = fp16(max|w| / 127), code = round(w / d)), so a decode step reads
half the bytes of fp16; a matrix whose rows are not whole blocks of 32 stays fp16. `f16` (MLC-LLM's
q4f16) and `f32` keep the names and store the matrix in that dtype. Norms and biases are float32. The reference folder (reference.py)
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
__all__ = ["CODES", "Q8", "Q8_BLOCK", "Q8_CODES", "Q8_SCALES", "SCALES", "SYM_ZERO", "ZEROS",
           "dequantize_q4", "dequantize_q8", "pack_q4", "pack_q8", "program_params", "q4_names",
           "q8_names"]

Q8 = "q8"               # `float_weights=q8`: float matrices as Q8_0 blocks
Q8_BLOCK = 32           # values per fp16 scale, as ggml's Q8_0
Q8_CODES, Q8_SCALES = "q8_codes", "q8_scales"


def q4_names(weight_name: str) -> tuple[str, str, str]:
    """The packed tensors' names of a linear weight `<owner>.weight`."""
    owner = weight_name.removesuffix(".weight")
    return f"{owner}.{CODES}", f"{owner}.{SCALES}", f"{owner}.{ZEROS}"


def q8_names(weight_name: str) -> tuple[str, str]:
    """The Q8_0 tensors' names of a float matrix `<owner>.weight`."""
    owner = weight_name.removesuffix(".weight")
    return f"{owner}.{Q8_CODES}", f"{owner}.{Q8_SCALES}"


def pack_q8(w: np.ndarray) -> dict[str, np.ndarray]:
    """{"q8_codes" int8 [N, K], "q8_scales" fp16 [N, K/32]} of a float matrix w [N, K] (K a
    multiple of 32): per block of 32, d = fp16(max|w| / 127) and code = round(w / d) (0 for an
    all-zero block), so code * d is within d / 2 of w. ggml's Q8_0 rounds with the unrounded d
    and stores the fp16 one; rounding d first makes the codes the nearest for the stored scale."""
    n, k = w.shape
    blocks = np.asarray(w, np.float32).reshape(n, k // Q8_BLOCK, Q8_BLOCK)
    d = (np.abs(blocks).max(axis=-1) / 127.0).astype(np.float16)
    d32 = d.astype(np.float32)[..., None]
    safe = np.where(d32 > 0, d32, 1.0)
    codes = np.where(d32 > 0, np.clip(np.rint(blocks / safe), -127, 127), 0).astype(np.int8)
    return {Q8_CODES: codes.reshape(n, k), Q8_SCALES: d}


def dequantize_q8(tensors: Mapping[str, np.ndarray]) -> np.ndarray:
    """float32 [N, K] = codes * their block's scale: the numpy reference of the kernels'."""
    codes = np.asarray(tensors[Q8_CODES]).astype(np.float32)
    scales = np.asarray(tensors[Q8_SCALES]).astype(np.float32)
    return codes * np.repeat(scales, Q8_BLOCK, axis=1)


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
    (2-D: the embedding, float linears such as a tied lm_head) as `float_dtype` (a numpy dtype,
    or Q8: pack_q8 where the rows are whole blocks of 32, else float16); the rest
    (norm weights, biases) as float32 (`rope.*` tables come from the program's own store: they
    are computed from the config). `layers` maps each linear to its storage, for the manifest."""
    params: dict[str, np.ndarray] = {}
    layers: dict[str, str] = {}
    linear_weights = {n.attrs["weight"] for g in program.entries.values() for n in g.nodes
                      if n.op == "linear"}
    names = sorted({w for g in program.entries.values() for w in g.weight_refs()})
    q8 = isinstance(float_dtype, str) and float_dtype == Q8   # (np.dtype("q8") is int64)
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
            if params[name].ndim == 2 and q8 and \
                    params[name].shape[1] % Q8_BLOCK == 0:
                packed = pack_q8(params.pop(name))
                for key, name_ in zip((Q8_CODES, Q8_SCALES), q8_names(name)):
                    params[name_] = packed[key]
                layers[name.removesuffix(".weight")] = "q8_0 (fp16 scales)"
                continue
            if params[name].ndim == 2:
                params[name] = params[name].astype(np.float16 if q8
                                                   else float_dtype)
            if name in linear_weights:
                layers[name.removesuffix(".weight")] = params[name].dtype.name
            elif params[name].ndim == 2:
                layers[name.removesuffix(".weight")] = params[name].dtype.name
    return params, layers
