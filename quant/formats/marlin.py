"""Marlin (IST-DASLab/marlin; vLLM `marlin` / gptq_marlin), docs/quant.md §6.

4-bit symmetric (implicit zero 8), fp16 activations, sm80+. With k = in_features, n = out_features
and codes `w_int` [k, n] (= canonical codes transposed):

1. tile:    w.reshape(k/16, 16, n/16, 16).transpose(0, 2, 1, 3).reshape(k/16, 16n)
2. permute: every chunk of 1024 values is gathered through PERM (new[j] = old[PERM[j]])
3. pack:    8 consecutive values per int32, value i at bits 4i

    B: int32 [k/16, 2n]
    s: fp16  [k/group, n]  grouped: rows of 64 gathered through SCALE_PERM;
                           per-channel (group_size -1, or group_size >= k): rows of 32 gathered
                           through SCALE_PERM_SINGLE (the rule vLLM's marlin_permute_scales uses)

Shape rules: k % 128 == 0 and n % 64 == 0 (vLLM; the original kernel wants n % 256 == 0).
`gptq_to_marlin` converts a symmetric 4-bit GPTQ checkpoint by data movement alone.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..weight import QuantizedWeight
from .base import Constraints, Format, FormatError, expect_shape, n_groups, require
from .bitpack import pack_bits, unpack_bits
from .registry import register


def _make_perms() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    perm: list[int] = []
    for i in range(32):  # one entry block per thread of a warp
        col = i // 4
        thread: list[int] = []
        for block in (0, 1):
            for row in (2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1):
                thread.append(16 * row + col + 8 * block)
        for j in range(4):
            perm.extend(p + 256 * j for p in thread)
    interleave = np.array([0, 2, 4, 6, 1, 3, 5, 7])
    perm_arr = np.array(perm).reshape(-1, 8)[:, interleave].ravel()
    scale_perm = np.array([i + 8 * j for i in range(8) for j in range(8)])
    scale_perm_single = np.array([2 * i + j for i in range(4)
                                  for j in (0, 1, 8, 9, 16, 17, 24, 25)])
    return perm_arr, scale_perm, scale_perm_single


PERM, SCALE_PERM, SCALE_PERM_SINGLE = _make_perms()
_INV_PERM = np.argsort(PERM)
_INV_SCALE_PERM = np.argsort(SCALE_PERM)
_INV_SCALE_PERM_SINGLE = np.argsort(SCALE_PERM_SINGLE)


def _grouped(group_size: int, k: int) -> bool:
    return group_size != -1 and group_size < k


def _pack_kn(w_kn: np.ndarray, s_gn: np.ndarray, grouped: bool) -> dict[str, np.ndarray]:
    """codes uint8 [k, n] and fp16 scales [groups, n] -> {"B", "s"} (data movement only)."""
    k, n = w_kn.shape
    tiles = w_kn.reshape(k // 16, 16, n // 16, 16).transpose(0, 2, 1, 3).reshape(k // 16, 16 * n)
    tiles = tiles.reshape(-1, PERM.size)[:, PERM].reshape(k // 16, 16 * n)
    perm = SCALE_PERM if grouped else SCALE_PERM_SINGLE
    s = s_gn.astype(np.float16).reshape(-1, perm.size)[:, perm].reshape(-1, n)
    return {"B": pack_bits(tiles, 4, 32, axis=-1).view(np.int32), "s": s}


class MarlinFormat(Format):
    name = "marlin"
    constraints = Constraints(
        bits=(4,), group_sizes=(-1, 32, 64, 128), sym=(True,), act_order=False,
        in_multiple=128, out_multiple=64, scale_dtype="float16",
        notes="k % 128 == 0, n % 64 == 0 (vLLM); the original Marlin kernel needs n % 256 == 0",
    )

    def nbytes(self, out_features: int, in_features: int, *, bits: int, group_size: int,
               sym: bool) -> int:
        """codes N·K·b/8 + fp16 scales per group and column (symmetric: no zero points)."""
        ng = n_groups(in_features, group_size)
        return out_features * in_features * bits // 8 + 2 * ng * out_features

    def pack(self, qw: QuantizedWeight) -> dict[str, np.ndarray]:
        self.check(qw)
        a = qw.numpy()
        return _pack_kn(a["codes"].T, a["scales"].T, _grouped(qw.group_size, qw.in_features))

    def unpack(self, tensors: Mapping[str, np.ndarray], out_features: int, in_features: int, *,
               bits: int = 4, group_size: int = 128, sym: bool = True) -> QuantizedWeight:
        k, n = in_features, out_features
        groups = n_groups(k, group_size)
        b = expect_shape(require(tensors, "B", self.name), (k // 16, 2 * n), "B", self.name)
        s = expect_shape(require(tensors, "s", self.name), (groups, n), "s", self.name)
        tiles = unpack_bits(b.view(np.uint32), 4, 16 * n, axis=-1)
        tiles = tiles.reshape(-1, PERM.size)[:, _INV_PERM]
        w_kn = tiles.reshape(k // 16, n // 16, 16, 16).transpose(0, 2, 1, 3).reshape(k, n)
        inv = _INV_SCALE_PERM if _grouped(group_size, k) else _INV_SCALE_PERM_SINGLE
        scales = s.reshape(-1, inv.size)[:, inv].reshape(groups, n).astype(np.float32)
        return QuantizedWeight(codes=w_kn.T, scales=scales.T,
                               zeros=np.full((n, groups), 8, np.int32), bits=4,
                               group_size=group_size, sym=True)

    def config(self, qw: QuantizedWeight) -> dict:
        return {"quant_method": "gptq", "checkpoint_format": "marlin", "bits": 4,
                "group_size": qw.group_size, "sym": True, "desc_act": False,
                "is_marlin_format": True}


def gptq_to_marlin(gptq_tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Repack a symmetric 4-bit GPTQ checkpoint tensor set ({qweight, qzeros, scales[, g_idx]})
    into Marlin's {B, s} by data movement alone (no dequantisation, no rounding)."""
    qweight = np.asarray(gptq_tensors["qweight"])
    scales = np.asarray(gptq_tensors["scales"])
    qzeros = np.asarray(gptq_tensors["qzeros"])
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    groups = scales.shape[0]
    if scales.shape[1] != n or k % groups or qzeros.shape != (groups, n // 8):
        raise FormatError(f"gptq_to_marlin: shapes qweight {qweight.shape}, qzeros "
                          f"{qzeros.shape}, scales {scales.shape} are not a 4-bit GPTQ set",
                          "pass the 4-bit gptq tensors of one layer")
    if not (qzeros.view(np.uint32) == np.uint32(0x77777777)).all():
        raise FormatError("gptq_to_marlin: qzeros are not all 7 (zero point 8); Marlin takes "
                          "symmetric 4-bit weights only", "requantise with sym=True")
    g_idx = gptq_tensors.get("g_idx")
    group = k // groups
    if g_idx is not None and not np.array_equal(np.asarray(g_idx), np.arange(k) // group):
        raise FormatError("gptq_to_marlin: g_idx is not the static grouping (act-order); "
                          "Marlin checkpoints carry no g_idx", "quantise with desc_act=False")
    group_size = -1 if groups == 1 else group
    w_kn = unpack_bits(qweight.view(np.uint32), 4, k, axis=0)
    return _pack_kn(w_kn, scales, _grouped(group_size, k))


MARLIN = register(MarlinFormat())
