"""The weights a Core ML lowering reads, and how a quantised linear becomes
`constexpr_blockwise_shift_scale` (iOS 18) carrying the canonical codes unchanged.

    src = SourceWeights(model_dir)                # float or quantised HF folder
                                                  # (arkinfer.lowering.source_weights)
    qw = src.quantised("model.layers.0.mlp.up_proj.weight")   # canonical QuantizedWeight | None
    args = blockwise_args(qw, "fp16")             # data / scale / offset for the MIL op
    back = canonical_from_blockwise(data, scale, offset, qw.bits)   # the inverse (verify.py)

Canonical weight (quant/weight.py): `W[o, k] = scales[o, g] * (codes[o, k] - zeros[o, g])`,
codes uint8 [out, in], scales fp32 and zeros int32 [out, n_groups], g = k // group_size.
The MIL op computes `output = scale * (data - offset)` per block, the block size implied by
`data.shape / scale.shape` = (1, group_size). So:

- symmetric (every zero = 2^(bits-1)): data = int4/int8 `codes - 2^(bits-1)` [out, in], no offset;
- asymmetric: data = uint4/uint8 `codes` [out, in], offset = uint4/uint8 `zeros` [out, n_groups];
- scale = `scales` [out, n_groups] in the compute dtype (fp16 for iPhone builds: GPTQ, AWQ and
  GGUF Q4_0 scales are fp16 numbers already, so nothing is rounded; anything else is refused).

Act-order weights (a non-static g_idx) have no block layout and are refused.
"""

from __future__ import annotations

import re

import numpy as np
from arkinfer.quant.weight import QuantizedWeight

from arkinfer.errors import NotAvailableError
from arkinfer.lowering import source_weights


def mil_name(weight_name: str) -> str:
    """The MIL op name of a weight: `model.layers.0.mlp.up_proj.weight` ->
    `model_layers_0_mlp_up_proj_weight` (MIL names are identifiers)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", weight_name)


class SourceWeights(source_weights.SourceWeights):
    """The shared reader (`quantised`: the canonical weight, named) with `tensor` giving float32
    numpy, which MIL consts take."""

    def tensor(self, name: str) -> np.ndarray:
        """A float tensor as fp32 numpy."""
        return self.float32(name)


def blockwise_args(qw: QuantizedWeight, scale_dtype: str) -> dict[str, np.ndarray]:
    """data / scale (/ offset) of `constexpr_blockwise_shift_scale` for a canonical weight
    (module docstring); raises NotAvailableError for weights the op cannot carry exactly."""
    from coremltools.converters.mil.mil import types

    who = qw.name or "a quantised linear"
    if qw.act_order:
        raise NotAvailableError(f"{who}: act-order (g_idx) weights have no block layout for "
                                "constexpr_blockwise_shift_scale",
                                hint="quantise with desc_act=False (the gptq / awq presets)")
    if qw.bits not in (4, 8):
        raise NotAvailableError(f"{who}: {qw.bits}-bit codes; constexpr_blockwise_shift_scale "
                                "takes 4- or 8-bit data", hint="quantise with --quant int4 (4 bits)")
    scales = qw.scales.numpy()
    np_scale = np.float16 if scale_dtype == "fp16" else np.float32
    scale = scales.astype(np_scale)
    if not np.array_equal(scale.astype(np.float32), scales):
        raise NotAvailableError(f"{who}: scales are not exact in {scale_dtype}",
                                hint="quantise into a format with fp16 scales (gptq, awq, "
                                "gguf-q4_0) or build with --quant f32 compute")
    codes = qw.codes.numpy()
    if qw.sym:
        mid = 1 << (qw.bits - 1)
        signed = types.np_int4_dtype if qw.bits == 4 else np.int8
        return {"data": (codes.astype(np.int16) - mid).astype(np.int8).astype(signed),
                "scale": scale}
    unsigned = types.np_uint4_dtype if qw.bits == 4 else np.uint8
    return {"data": codes.astype(unsigned), "scale": scale,
            "offset": qw.zeros.numpy().astype(np.uint8).astype(unsigned)}


def canonical_from_blockwise(data: np.ndarray, scale: np.ndarray, offset: np.ndarray | None,
                             bits: int, signed: bool, name: str = "") -> QuantizedWeight:
    """The canonical weight a `constexpr_blockwise_shift_scale` op holds (inverse of
    `blockwise_args`; scales widened to fp32, which is exact)."""
    data = np.asarray(data).astype(np.int16)
    out, inp = data.shape
    n_groups = scale.shape[1]
    group = -1 if n_groups == 1 else inp // n_groups
    if signed:
        mid = 1 << (bits - 1)
        codes = data + mid
        zeros = np.full((out, n_groups), mid, np.int32)
    else:
        codes = data
        zeros = np.asarray(offset).astype(np.int32)
    return QuantizedWeight(codes.astype(np.uint8), np.asarray(scale).astype(np.float32), zeros,
                           bits, group, signed, None, name=name)
