"""The TVM artifact's weights: float tensors, and group-quantised 4-bit linears in the layout the
module's int4 kernel reads (MLC-LLM's `q4f16` idea: packed uint32 codes + fp16 group scales).

One linear weight `W` (torch layout `[N, K]` = `[out_features, in_features]`, group size `g`):

    <name>.q4_codes   uint32 [N, K/8]   word w of row n holds columns 8w .. 8w+7, column 8w+i in
                                        bits 4i .. 4i+3 (the first column in the low nibble;
                                        little-endian bytes: byte j = columns 8w+2j (low nibble)
                                        and 8w+2j+1 (high nibble))
    <name>.q4_scales  float16 [N, K/g]  (float32 when a scale is not exactly representable in
                                        fp16, e.g. ORT's fp32 scales: never a silent rounding)
    <name>.q4_zeros   uint8 [N, K/g]    zero points; only for asymmetric recipes (symmetric: 8)

    W[n, k] = scales[n, k // g] * (code(n, k) - zero(n, k // g))     (computed in fp32)

which is the canonical definition (`quant/weight.py`), so packing is lossless: the artifact holds
exactly the weights the recipe produced. Float tensors keep their names: float matrices
(embedding, a float lm_head) in the build's `float_weights` dtype (float16 by default, like
MLC-LLM's q4f16; float32 with `--option float_weights=f32`), norms and biases as float32. The
reference folder (reference.py) is written from these stored values, so runtime fidelity
compares the module with the reference on exactly the same weights. `dequantize_q4` is the numpy reference of what the kernel computes.

    src = SourceWeights(model_dir)   # arkinfer.lowering.source_weights: a float folder or a
                                     # quantised one (any format)
    params, layers = program_params(program, src)        # the module's params, in its layout
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from arkinfer.quant.formats.bitpack import pack_bits, unpack_bits
from arkinfer.quant.weight import QuantizedWeight

from arkinfer.errors import TargetError
from arkinfer.lowering.source_weights import SourceWeights

BITS = 4
SYM_ZERO = 1 << (BITS - 1)
CODES, SCALES, ZEROS = "q4_codes", "q4_scales", "q4_zeros"


def q4_names(weight_name: str) -> tuple[str, str, str]:
    """The packed tensors' names of a linear weight `<owner>.weight`."""
    owner = weight_name.removesuffix(".weight")
    return f"{owner}.{CODES}", f"{owner}.{SCALES}", f"{owner}.{ZEROS}"


def pack_q4(qw: QuantizedWeight) -> dict[str, np.ndarray]:
    """{"q4_codes", "q4_scales"[, "q4_zeros"]} of a canonical 4-bit weight (layout: module doc).

    Raises TargetError for what the kernel cannot take: other bit widths, act-order, a group
    size that does not split the row into whole 8-column words."""
    who = f"linear {qw.name!r}" if qw.name else "linear"
    if qw.bits != BITS or str(qw.kind) != "uniform":
        raise TargetError(f"{who} is {qw.bits}-bit {qw.kind}; the tvm int4 kernel takes uniform "
                          "4-bit weights", hint="quantise with a 4-bit preset (e.g. --quant q4f16)")
    if qw.act_order:
        raise TargetError(f"{who} has an act-order g_idx; the tvm int4 kernel reads static groups",
                          hint="quantise with desc_act=False")
    a = qw.numpy()
    n, k = a["codes"].shape
    group = k if qw.group_size == -1 else qw.group_size
    if k % 8 or group % 8:
        raise TargetError(f"{who}: in_features={k} / group_size={group} are not multiples of 8 "
                          "(one uint32 word holds 8 codes)", hint="use group size 32 or 64")
    scales = a["scales"].astype(np.float32)
    as16 = scales.astype(np.float16)
    out = {CODES: pack_bits(a["codes"], BITS, 32, axis=1),
           SCALES: as16 if np.array_equal(as16.astype(np.float32), scales) else scales}
    if not (a["zeros"] == SYM_ZERO).all():
        out[ZEROS] = a["zeros"].astype(np.uint8)
    return out


def dequantize_q4(tensors: Mapping[str, np.ndarray], in_features: int) -> np.ndarray:
    """float32 [N, K]: the numpy reference of the kernel's dequantisation (module doc formula)."""
    codes = unpack_bits(np.asarray(tensors[CODES]), BITS, in_features, axis=1).astype(np.float32)
    scales = np.asarray(tensors[SCALES]).astype(np.float32)
    group = in_features // scales.shape[1]
    zeros = np.asarray(tensors[ZEROS]).astype(np.float32) if ZEROS in tensors else \
        np.full(scales.shape, SYM_ZERO, np.float32)
    return (codes - np.repeat(zeros, group, axis=1)) * np.repeat(scales, group, axis=1)


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
