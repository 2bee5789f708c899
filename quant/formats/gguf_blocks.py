"""ggml block types in numpy: byte codecs, ggml's reference quantisers, dequantisation.

Bytes exactly as ggml (`ggml-quants.c`), little-endian, one row = consecutive blocks:

    Q4_0  (32 w, 18 B):  fp16 d | 16 B, byte j = q[j] | q[j+16] << 4        value (q - 8) * d
    Q4_1  (32 w, 20 B):  fp16 d | fp16 m | 16 B as Q4_0                     value q * d + m
    Q8_0  (32 w, 34 B):  fp16 d | 32 x int8                                 value q * d
    Q5_0  (32 w, 22 B):  fp16 d | 4 B qh | 16 B qs; q = (qs nibble as Q4_0) | (bit j of the
                         little-endian uint32 qh) << 4                       value (q - 16) * d
    Q5_1  (32 w, 24 B):  fp16 d | fp16 m | qh | qs as Q5_0                   value q * d + m
    Q4_K  (256 w, 144 B): fp16 d | fp16 dmin | 12 B scales | 128 B qs; 8 sub-blocks of 32 with
                         6-bit sc[j], m[j]: bytes j<4 = sc[j] | (sc[j+4] >> 4) << 6, bytes 4+j =
                         m[j] | (m[j+4] >> 4) << 6, bytes 8+j = sc[j+4] & 15 | (m[j+4] & 15) << 4;
                         qs byte 32c + l = q[64c + l] | q[64c + 32 + l] << 4
                                                              value (d * sc) * q - (dmin * m)
    Q5_K  (256 w, 176 B): as Q4_K with 32 B qh after the scales: bit j of qh[l] is the 5th bit
                         of weight 32j + l                     value (d * sc) * q - (dmin * m)
    IQ4_NL (32 w, 18 B): fp16 d | 16 B as Q4_0; q indexes the fixed table KVALUES_IQ4NL
                         (-127 .. 113, non-uniform)                          value d * table[q]
    Q6_K  (256 w, 210 B): 128 B ql | 64 B qh | 16 x int8 sc | fp16 d; 16 sub-blocks of 16; in
                         each 128-weight half h: ql[64h + l] = low nibbles of weights l | l + 64,
                         qh[32h + l] bits 2k = high 2 bits of weight 32k + l   value (d*sc)*(q-32)
    TQ2_0 (256 w, 66 B): 64 B | fp16 d; code = trit + 1; in each 32-byte half h, byte m holds
                         weights 128h + m + 32l at bits 2l (l = 0..3)       value (code - 1) * d
    TQ1_0 (256 w, 54 B): 48 B of 5 trits/byte | 4 B of 4 trits/byte | fp16 d   value trit * d
                         (base-3 digits, most significant first, byte = ceil(x * 256 / 243))
    F16 / BF16: one 2-byte float per weight (BF16 rounds to nearest even, NaN kept quiet)

`quantize_gguf` reproduces ggml's `quantize_row_*_ref` (and gguf-py's numpy port) byte for byte;
ggml rounds with `roundf` (half away from zero) and computes `x * (1/d)`, not `x / d`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .ggml_types import BLOCK, GGMLType  # declared there, below ggml_native.py too

#: IQ4_NL's 16 levels (ggml-common.h kvalues_iq4nl): value = d * KVALUES_IQ4NL[q].
KVALUES_IQ4NL: tuple[int, ...] = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69,
                                  89, 113)
_POW3 = np.array([81, 27, 9, 3, 1], dtype=np.uint16)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).reshape(-1, 1).view(np.uint8)


def _f16_value(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32).reshape(-1)


def roundf(x: np.ndarray) -> np.ndarray:
    """C roundf (half away from zero), exact for every float32 (no `x + 0.5` rounding)."""
    a = np.abs(x)
    whole = np.floor(a)
    return np.sign(x) * (whole + np.floor(2 * (a - whole)))


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


# ------------------------------------------------------------------------------- byte codecs
def encode_q4(q: np.ndarray, d: np.ndarray, m: np.ndarray | None = None) -> np.ndarray:
    """q uint8 [nb, 32] (< 16), d [nb] (and m [nb] for Q4_1) -> Q4_0 [nb, 18] / Q4_1 [nb, 20]."""
    q = q.astype(np.uint8)
    qs = q[:, :16] | (q[:, 16:] << np.uint8(4))
    head = [_f16_bytes(d)] + ([] if m is None else [_f16_bytes(m)])
    return np.concatenate([*head, qs], axis=1)


def decode_q4(blocks: np.ndarray, with_min: bool) -> tuple[np.ndarray, ...]:
    """Q4_0 [nb, 18] -> (q [nb, 32], d [nb]); Q4_1 [nb, 20] -> (q, d, m)."""
    off = 4 if with_min else 2
    qs = blocks[:, off:]
    q = np.concatenate([qs & np.uint8(0xF), qs >> np.uint8(4)], axis=1)
    d = _f16_value(blocks[:, :2])
    return (q, d, _f16_value(blocks[:, 2:4])) if with_min else (q, d)


def encode_q5(q: np.ndarray, d: np.ndarray, m: np.ndarray | None = None) -> np.ndarray:
    """q uint8 [nb, 32] (< 32), d [nb] (and m [nb] for Q5_1) -> Q5_0 [nb, 22] / Q5_1 [nb, 24]."""
    q = q.astype(np.uint8)
    qh = np.packbits((q >> np.uint8(4)) & np.uint8(1), axis=1, bitorder="little")
    qs = (q[:, :16] & np.uint8(15)) | ((q[:, 16:] & np.uint8(15)) << np.uint8(4))
    head = [_f16_bytes(d)] + ([] if m is None else [_f16_bytes(m)])
    return np.concatenate([*head, qh, qs], axis=1)


def decode_q5(blocks: np.ndarray, with_min: bool) -> tuple[np.ndarray, ...]:
    """Q5_0 [nb, 22] -> (q [nb, 32], d [nb]); Q5_1 [nb, 24] -> (q, d, m)."""
    off = 4 if with_min else 2
    high = np.unpackbits(blocks[:, off:off + 4], axis=1, bitorder="little")
    qs = blocks[:, off + 4:]
    q = np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=1) | (high << np.uint8(4))
    d = _f16_value(blocks[:, :2])
    return (q, d, _f16_value(blocks[:, 2:4])) if with_min else (q, d)


def _pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """6-bit sc, m uint8 [nb, 8] -> the 12 scale bytes of Q4_K / Q5_K [nb, 12]."""
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    lo = (sc[:, :4] & np.uint8(63)) | ((sc[:, 4:] >> np.uint8(4)) << np.uint8(6))
    mid = (m[:, :4] & np.uint8(63)) | ((m[:, 4:] >> np.uint8(4)) << np.uint8(6))
    hi = (sc[:, 4:] & np.uint8(15)) | ((m[:, 4:] & np.uint8(15)) << np.uint8(4))
    return np.concatenate([lo, mid, hi], axis=1)


def _unpack_k_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 scale bytes [nb, 12] -> (sc, m) uint8 [nb, 8]."""
    lo, mid, hi = b[:, :4], b[:, 4:8], b[:, 8:12]
    sc = np.concatenate([lo & np.uint8(63), (hi & np.uint8(15)) | ((lo >> np.uint8(6)) << np.uint8(4))],
                        axis=1)
    m = np.concatenate([mid & np.uint8(63), (hi >> np.uint8(4)) | ((mid >> np.uint8(6)) << np.uint8(4))],
                       axis=1)
    return sc, m


def _nibbles_k(q: np.ndarray) -> np.ndarray:
    """q [nb, 256] -> Q4_K / Q5_K qs [nb, 128]: byte 32c + l = q[64c + l] | q[64c + 32 + l] << 4."""
    q = (q.astype(np.uint8) & np.uint8(15)).reshape(-1, 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << np.uint8(4))).reshape(-1, 128)


def _from_nibbles_k(qs: np.ndarray) -> np.ndarray:
    qs = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=2).reshape(-1, 256)


def encode_qk(q: np.ndarray, d: np.ndarray, dmin: np.ndarray, sc: np.ndarray, m: np.ndarray,
              bits: int) -> np.ndarray:
    """q uint8 [nb, 256] (< 2^bits), fp16-exact d, dmin [nb], 6-bit sc, m [nb, 8] ->
    Q4_K [nb, 144] (bits 4) / Q5_K [nb, 176] (bits 5)."""
    parts = [_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, m)]
    if bits == 5:
        high = ((q.astype(np.uint8) >> np.uint8(4)) & np.uint8(1)).reshape(-1, 8, 32)
        parts.append((high << np.arange(8, dtype=np.uint8)[None, :, None]).sum(
            axis=1, dtype=np.uint8))
    return np.concatenate([*parts, _nibbles_k(q)], axis=1)


def decode_qk(blocks: np.ndarray, bits: int) -> tuple[np.ndarray, ...]:
    """Q4_K / Q5_K blocks -> (q uint8 [nb, 256], d [nb], dmin [nb], sc [nb, 8], m [nb, 8])."""
    d, dmin = _f16_value(blocks[:, :2]), _f16_value(blocks[:, 2:4])
    sc, m = _unpack_k_scales(blocks[:, 4:16])
    q = _from_nibbles_k(blocks[:, 16 + (32 if bits == 5 else 0):])
    if bits == 5:
        qh = blocks[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8)[None, :, None]
        q = q | ((qh & np.uint8(1)) << np.uint8(4)).reshape(-1, 256)
    return q, d, dmin, sc, m


def encode_q6_k(q: np.ndarray, d: np.ndarray, sc: np.ndarray) -> np.ndarray:
    """q uint8 [nb, 256] (< 64, value q - 32), fp16-exact d [nb], int8 sc [nb, 16] -> [nb, 210]."""
    q = q.astype(np.uint8).reshape(-1, 2, 128)
    low = q & np.uint8(15)
    ql = low[:, :, :64] | (low[:, :, 64:] << np.uint8(4))               # [nb, 2, 64]
    high = (q >> np.uint8(4)).reshape(-1, 2, 4, 32)
    qh = (high << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]).sum(
        axis=2, dtype=np.uint8)                                           # [nb, 2, 32]
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64),
                           sc.astype(np.int8).view(np.uint8), _f16_bytes(d)], axis=1)


def decode_q6_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q6_K [nb, 210] -> (q uint8 [nb, 256] (value q - 32), d [nb], sc int8 [nb, 16])."""
    ql = blocks[:, :128].reshape(-1, 2, 1, 64)
    low = np.concatenate([ql & np.uint8(15), ql >> np.uint8(4)], axis=2).reshape(-1, 2, 128)
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8)
                                                      )[None, None, :, None]
    high = (qh & np.uint8(3)).reshape(-1, 2, 128)
    q = (low | (high << np.uint8(4))).reshape(-1, 256)
    sc = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8)
    return q, _f16_value(blocks[:, 208:210]), sc


def encode_q8_0(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """q int8 [nb, 32], d [nb] -> [nb, 34]."""
    return np.concatenate([_f16_bytes(d), q.astype(np.int8).view(np.uint8)], axis=1)


def decode_q8_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.ascontiguousarray(blocks[:, 2:]).view(np.int8), _f16_value(blocks[:, :2])


def encode_tq2_0(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    """codes uint8 [nb, 256] in {0, 1, 2} (trit + 1), d [nb] -> [nb, 66]."""
    c = codes.astype(np.uint8).reshape(-1, 2, 4, 32)
    qs = c[:, :, 0] | (c[:, :, 1] << 2) | (c[:, :, 2] << 4) | (c[:, :, 3] << 6)
    return np.concatenate([qs.reshape(-1, 64), _f16_bytes(d)], axis=1)


def decode_tq2_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    qs = blocks[:, :64].reshape(-1, 2, 1, 32)
    codes = (qs >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
    return codes.reshape(-1, 256), _f16_value(blocks[:, 64:])


def _base3_bytes(digits: np.ndarray) -> np.ndarray:
    """digits [nb, k, width] (most significant digit first, k digits) -> fixed-point bytes."""
    k = digits.shape[1]
    x = (digits.astype(np.uint16) * _POW3[:k].reshape(1, k, 1)).sum(axis=1, dtype=np.uint16)
    return ((x * 256 + 242) // 243).astype(np.uint8)  # ceil(x * 256 / 243)


def encode_tq1_0(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    """codes uint8 [nb, 256] in {0, 1, 2} (trit + 1), d [nb] -> [nb, 54]."""
    c = codes.astype(np.uint8)
    nb = c.shape[0]
    qs0 = _base3_bytes(c[:, :160].reshape(nb, 5, 32))     # weights 0..159: 5 trits/byte
    qs1 = _base3_bytes(c[:, 160:240].reshape(nb, 5, 16))  # weights 160..239
    qh = _base3_bytes(c[:, 240:].reshape(nb, 4, 4))        # weights 240..255: 4 trits/byte
    return np.concatenate([qs0, qs1, qh, _f16_bytes(d)], axis=1)


def _trits_of(b: np.ndarray, k: int) -> np.ndarray:
    """bytes [nb, w] -> digits [nb, k, w]: digit i = ((uint8)(b * 3^i) * 3) >> 8."""
    mul = np.array([1, 3, 9, 27, 81][:k], np.uint8).reshape(1, k, 1)
    shifted = (b[:, None, :] * mul).astype(np.uint8)  # wraps mod 256, as in C
    return ((shifted.astype(np.uint16) * 3) >> 8).astype(np.uint8)


def decode_tq1_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    nb = blocks.shape[0]
    parts = [_trits_of(blocks[:, :32], 5).reshape(nb, 160),
             _trits_of(blocks[:, 32:48], 5).reshape(nb, 80),
             _trits_of(blocks[:, 48:52], 4).reshape(nb, 16)]
    return np.concatenate(parts, axis=1), _f16_value(blocks[:, 52:])


# ------------------------------------------------------------------------ ggml's quantisers
def _bf16(x: np.ndarray) -> np.ndarray:
    n = x.view(np.uint32)
    quiet = (n & np.uint32(0xFFFF0000)) | np.uint32(64 << 16)  # NaN stays a (quiet) NaN
    n = np.where((n & 0x7FFFFFFF) > 0x7F800000, quiet, n)
    return ((n.astype(np.uint64) + (0x7FFF + ((n >> 16) & 1))) >> 16).astype(np.uint16)


_NATIVE: list = []   # [the loaded gguf_quant library or None], filled on first use


def _native_library():
    """gguf_quant.c compiled once per machine (arkinfer/native_build.py), or None where it
    cannot be built or run (then the torch path below quantises)."""
    if not _NATIVE:
        import ctypes
        import warnings

        from arkinfer.native_build import FLAGS, NativeBuildError, load_library

        try:
            lib = load_library("gguf_quant", [Path(__file__).with_name("gguf_quant.c")],
                               [*FLAGS, "-ffp-contract=off"])
        except NativeBuildError as exc:
            warnings.warn(f"the C GGUF quantiser is unavailable ({exc}); using torch",
                          RuntimeWarning, stacklevel=3)
            lib = None
        if lib is not None:
            for fn in (lib.ark_quantize_q4_0, lib.ark_quantize_q8_0):
                fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
                fn.restype = ctypes.c_int64
        _NATIVE.append(lib)
    return _NATIVE[0]


def _quantize_native(b: np.ndarray, qtype: GGMLType) -> bytes | None:
    """Q8_0 / Q4_0 of blocks `b` [n, 32] (float32, C-contiguous) by gguf_quant.c: ggml's
    arithmetic in C, one pass over the weights (about 10x the torch path on SmolLM2 here). None
    when the library is unavailable or a value is not finite (the numpy code then handles it as
    ggml does)."""
    lib = _native_library()
    if lib is None:
        return None
    fn = lib.ark_quantize_q4_0 if qtype is GGMLType.Q4_0 else lib.ark_quantize_q8_0
    out = np.empty((b.shape[0], BLOCK[qtype][1]), np.uint8)
    return None if fn(b.ctypes.data, b.shape[0], out.ctypes.data) else out.tobytes()


def _quantize_torch(b: np.ndarray, qtype: GGMLType) -> bytes:
    """Q8_0 / Q4_0 of finite blocks `b` [n, 32] with torch's vectorised, multi-threaded ops: the
    same fp32 operations in the same order as the numpy code below it (and ggml's reference
    quantiser), so the bytes are identical (tests/quant/test_quant_gguf_blocks.py compares with
    gguf-py and llama.cpp); about 4x faster on SmolLM2's 135 M weights here. None when a value is
    not finite (the numpy code then handles it as ggml does)."""
    import torch

    t = torch.from_numpy(b)
    if not bool(torch.isfinite(t).all()):
        return None
    if qtype is GGMLType.Q8_0:
        d = t.abs().amax(dim=1) / 127.0
    else:  # Q4_0: the signed value of largest magnitude (first one on ties), over -8
        d = t.gather(1, t.abs().argmax(dim=1, keepdim=True))[:, 0] / -8.0
    inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
    y = t * inv[:, None]
    if qtype is GGMLType.Q8_0:   # roundf: half away from zero
        whole = y.abs().floor_()
        frac2 = y.abs().sub_(whole).mul_(2).floor_()
        q = whole.add_(frac2).mul_(y.sign()).to(torch.int8).view(torch.uint8)
    else:
        q = y.add_(8.5).trunc_().clamp_(0, 15).to(torch.uint8)
        q = q[:, :16] | (q[:, 16:] << 4)
    head = d.to(torch.float16).view(torch.uint8).reshape(-1, 2)
    return torch.cat([head, q], dim=1).numpy().tobytes()


def quantize_gguf(w: np.ndarray, qtype: GGMLType | int) -> bytes:
    """ggml's reference quantiser for `qtype` applied to float32 `w` [..., n] (row-major; n a
    multiple of the block size) -> the tensor's bytes, identical to `gguf.quants.quantize`."""
    qtype = GGMLType(qtype)
    x = np.ascontiguousarray(w, dtype=np.float32)
    size = BLOCK[qtype][0]
    if x.shape[-1] % size:
        raise ValueError(f"rows of {x.shape[-1]} values are not a multiple of {qtype.name}'s "
                         f"block of {size}")
    if qtype is GGMLType.F32:
        return x.tobytes()
    if qtype is GGMLType.F16:
        return x.astype(np.float16).tobytes()
    if qtype is GGMLType.BF16:
        return _bf16(x).tobytes()
    b = x.reshape(-1, size)
    if qtype in (GGMLType.Q8_0, GGMLType.Q4_0):
        fast = _quantize_native(b, qtype)
        if fast is None:
            fast = _quantize_torch(b, qtype)
        if fast is not None:
            return fast
    if qtype is GGMLType.Q8_0:
        d = np.abs(b).max(axis=1) / np.float32(127)
        return encode_q8_0(roundf(b * _inverse(d)[:, None]), d).tobytes()
    if qtype in (GGMLType.Q4_0, GGMLType.Q5_0):  # d = signed max / -2^(bits-1)
        half = 8 if qtype is GGMLType.Q4_0 else 16
        amax = np.take_along_axis(b, np.abs(b).argmax(axis=1)[:, None], axis=1)[:, 0]
        d = amax / np.float32(-half)
        q = np.trunc(b * _inverse(d)[:, None] + np.float32(half + 0.5))
        encode = encode_q4 if half == 8 else encode_q5
        return encode(np.clip(q, 0, 2 * half - 1), d).tobytes()
    if qtype in (GGMLType.Q4_1, GGMLType.Q5_1):  # d = (max - min) / (2^bits - 1), m = min
        top = 15 if qtype is GGMLType.Q4_1 else 31
        lo, hi = b.min(axis=1), b.max(axis=1)
        d = (hi - lo) / np.float32(top)
        q = np.trunc((b - lo[:, None]) * _inverse(d)[:, None] + np.float32(0.5))
        encode = encode_q4 if top == 15 else encode_q5
        return encode(np.clip(q, 0, top), d, lo).tobytes()
    if qtype in K_QUANTS or qtype is GGMLType.IQ4_NL:
        return _quantize_k(x, qtype)
    # TQ1_0 / TQ2_0: d = absmax of the 256-block, trit = roundf(x / d)
    d = np.abs(b).max(axis=1)
    codes = (roundf(b * _inverse(d)[:, None]) + 1).astype(np.uint8)
    enc = encode_tq2_0 if qtype is GGMLType.TQ2_0 else encode_tq1_0
    return enc(codes, d).tobytes()


K_QUANTS = (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)


def _quantize_k(x: np.ndarray, qtype: GGMLType) -> bytes:
    """A K-quant (or IQ4_NL) of float32 rows `x` [..., n]: llama.cpp's own quantiser (ggml's
    `quantize_row_*_ref`, through the libggml that llama-cpp-python ships) when it is installed,
    so the bytes are llama-quantize's; otherwise ArkInfer's RTN (rtn.quantize_rtn with the
    format's sub-scale snapping or table: same layout, a different parameter search)."""
    from .ggml_native import ggml_quantize

    rows = x.reshape(-1, x.shape[-1])
    data = ggml_quantize(rows, int(qtype))
    if data is not None:
        return data
    import torch

    from ..rtn import quantize_rtn
    from .registry import get_format

    name = {GGMLType.Q4_K: "gguf-q4_k", GGMLType.Q5_K: "gguf-q5_k",
            GGMLType.Q6_K: "gguf-q6_k", GGMLType.IQ4_NL: "gguf-iq4_nl"}[qtype]
    fmt = get_format(name)
    c = fmt.constraints
    qw = quantize_rtn(torch.from_numpy(np.ascontiguousarray(rows)), c.bits[0], c.group_sizes[0],
                      c.sym[0], grid="mse", fmt=fmt)
    return fmt.pack(qw)["weight"].tobytes()


def dequantize_gguf(data: bytes | np.ndarray, qtype: GGMLType | int, n: int) -> np.ndarray:
    """Bytes of `qtype` -> float32 [rows, n] exactly as ggml's dequantize_row_* computes."""
    qtype = GGMLType(qtype)
    raw = np.frombuffer(bytes(data), np.uint8) if isinstance(data, (bytes, bytearray)) \
        else np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    nbytes = BLOCK[qtype][1]
    if qtype is GGMLType.F32:
        return raw.view(np.float32).reshape(-1, n).copy()
    if qtype is GGMLType.F16:
        return raw.view(np.float16).astype(np.float32).reshape(-1, n)
    if qtype is GGMLType.BF16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(-1, n)
    blocks = raw.reshape(-1, nbytes)
    if qtype is GGMLType.Q8_0:
        q, d = decode_q8_0(blocks)
        vals = q.astype(np.float32) * d[:, None]
    elif qtype in (GGMLType.Q4_0, GGMLType.Q5_0):  # (q - 2^(bits-1)) * d
        decode, half = (decode_q4, 8) if qtype is GGMLType.Q4_0 else (decode_q5, 16)
        q, d = decode(blocks, with_min=False)
        vals = d[:, None] * (q.astype(np.float32) - np.float32(half))
    elif qtype in (GGMLType.Q4_1, GGMLType.Q5_1):  # q * d + m
        decode = decode_q4 if qtype is GGMLType.Q4_1 else decode_q5
        q, d, m = decode(blocks, with_min=True)
        vals = d[:, None] * q.astype(np.float32) + m[:, None]
    elif qtype in (GGMLType.Q4_K, GGMLType.Q5_K):
        q, d, dmin, sc, m = decode_qk(blocks, 5 if qtype is GGMLType.Q5_K else 4)
        scale = (d[:, None] * sc.astype(np.float32)).repeat(32, axis=1)
        low = (dmin[:, None] * m.astype(np.float32)).repeat(32, axis=1)
        vals = scale * q.astype(np.float32) - low
    elif qtype is GGMLType.IQ4_NL:
        q, d = decode_q4(blocks, with_min=False)
        vals = d[:, None] * np.asarray(KVALUES_IQ4NL, np.float32)[q]
    elif qtype is GGMLType.Q6_K:
        q, d, sc = decode_q6_k(blocks)
        scale = (d[:, None] * sc.astype(np.float32)).repeat(16, axis=1)
        vals = scale * (q.astype(np.float32) - np.float32(32))
    else:
        codes, d = (decode_tq2_0 if qtype is GGMLType.TQ2_0 else decode_tq1_0)(blocks)
        vals = d[:, None] * (codes.astype(np.float32) - np.float32(1))
    return vals.astype(np.float32).reshape(-1, n)
