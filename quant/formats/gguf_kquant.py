"""The sub-scales of GGUF K-quants: snapping group parameters to them, and factoring them back.

A K-quant super-block holds 256 weights of one row in sub-blocks (Q4_K / Q5_K: 8 of 32, Q6_K:
16 of 16) whose parameters are themselves quantised against one fp16 super-scale:

    Q4_K / Q5_K  scale_j = d · sc_j,  min_j = dmin · m_j     sc_j, m_j in 0..63 (6 bits)
    Q6_K         scale_j = d · sc_j                          sc_j in -128..127 (int8)

(each product in float32, as ggml's dequantize_row_*). `snap` maps free group parameters
[out, n_groups] to the nearest such values, as llama.cpp's quantize_row_*_ref does after its
per-sub-block search (Q4_K: d = max scale / 63; Q6_K: d = signed max scale / -128), but with the
fp16-rounded d, so every snapped value is exactly d · sc. `factor` recovers (d, sc) from values:
it tries the super-block's value of largest magnitude as each allowed integer multiple of d
(Q6_K: -128, 127, -127, ...; Q4_K: 63, 62, ...) and keeps the first d for which every value
is exactly d · sc; a super-block with no such d is unrepresentable (pack refuses it).
"""

from __future__ import annotations

import numpy as np


def _f16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def _product(d: np.ndarray, k: np.ndarray) -> np.ndarray:
    """float32 d [nb] x integer k [nb, n] -> d · k in float32, -0.0 written as +0.0."""
    return (d[:, None].astype(np.float32) * k.astype(np.float32)) + np.float32(0)


def _largest(v: np.ndarray) -> np.ndarray:
    """[nb, n] -> the signed value of largest magnitude per row (the first one on ties)."""
    return np.take_along_axis(v, np.abs(v).argmax(axis=1)[:, None], axis=1)[:, 0]


def snap(values: np.ndarray, n_sub: int, signed: bool) -> np.ndarray:
    """values float32 [out, n_groups] (n_groups a multiple of n_sub) -> the nearest values of
    the form fp16 d · k per super-block of n_sub groups; k in -128..127 (signed, int8, d =
    largest / -128) or 0..63 (unsigned, 6-bit, d = max / 63; negative values become 0)."""
    v = np.asarray(values, np.float32)
    flat = v.reshape(-1, n_sub)
    if signed:
        d, lo, hi = _f16(_largest(flat) / np.float32(-128)), -128, 127
    else:
        flat = np.maximum(flat, 0)
        d, lo, hi = _f16(flat.max(axis=1) / np.float32(63)), 0, 63
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.where(d[:, None] == 0, 0, np.clip(np.rint(flat / d[:, None]), lo, hi))
    return _product(d, k).reshape(v.shape)


def factor(values: np.ndarray, signed: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """values float32 [nb, n_sub] -> (d float32 [nb] (fp16-exact), k int16 [nb, n_sub], index
    of the first super-block with no factorisation or -1). k in -128..127 (signed) / 0..63."""
    v = np.asarray(values, np.float32)
    nb = v.shape[0]
    lo, hi = (-128, 127) if signed else (0, 63)
    order = [-128] + [s * i for i in range(127, 0, -1) for s in (1, -1)] if signed \
        else list(range(63, 0, -1))
    d = np.zeros(nb, np.float32)
    k = np.zeros(v.shape, np.int16)
    ref = _largest(v) if nb else np.zeros(0, np.float32)
    todo = np.flatnonzero(ref != 0)
    bad_zero = np.flatnonzero((ref == 0) & (np.abs(v).max(axis=1, initial=0) != 0))
    for c in order:
        if not todo.size:
            break
        dc = _f16(ref[todo] / np.float32(c))
        with np.errstate(divide="ignore", invalid="ignore"):
            kc = np.rint(v[todo] / dc[:, None])
        ok = (dc != 0) & np.isfinite(kc).all(axis=1) & ((kc >= lo) & (kc <= hi)).all(axis=1)
        kc = np.where(np.isfinite(kc), np.clip(kc, lo, hi), 0)
        ok &= (_product(dc, kc) == v[todo]).all(axis=1)
        hit = todo[ok]
        d[hit], k[hit] = dc[ok], kc[ok].astype(np.int16)
        todo = todo[~ok]
    bad = np.concatenate([todo, bad_zero])
    return d, k, int(bad.min()) if bad.size else -1
