"""ArkInfer's custom ops as compositions of MIL ops (iOS 18 opset), called inside a MIL Builder
function: `rms_norm`, `rope`, dense causal GQA `attention` over a fixed-size KV state, and the
shared masks. InfLLM v2 lives in `infllmv2.py`. `program.py` calls them for the IR's ops.

Layouts (B = 1): x [1, T, H]; q [1, Hq, T, D]; the KV cache is the *whole* state
k, v [1, Hkv, Smax, D], of which positions 0 .. start + T - 1 are valid (the rest is masked out);
`pos` int32 [T] holds the absolute positions start .. start + T - 1.

Precision (docs in README.md): activations run in the build's compute dtype (fp16 for an iPhone
build); the statistics of rms_norm, the RoPE angles (positions up to 32K do not fit fp16's 11-bit
significand), the attention logits and softmax are fp32, as the reference computes them.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import Var

# A large finite negative instead of -inf for masked logits: a row always keeps key 0, so the
# softmax never sees only masked entries, and no device has to handle inf - inf.
MASKED = -3.0e38


def as_dtype(x: Var, dtype: str) -> Var:
    """`x` cast to "fp16" / "fp32" / "int32" (no op when it already is)."""
    have = {"fp16": "fp16", "fp32": "fp32", "int32": "int32"}.get(_dtype_name(x))
    return x if have == dtype else mb.cast(x=x, dtype=dtype)


def _dtype_name(x: Var) -> str:
    from coremltools.converters.mil.mil import types

    return types.builtin_to_string(x.dtype)


def rms_norm(x: Var, weight: np.ndarray, eps: float, act: str) -> Var:
    """x [.., H] -> [.., H] in `act`: `weight * (x * rsqrt(mean(x²) + eps))`, the statistics in
    fp32 and the normalised value cast to `act` before the weight (arkinfer::rms_norm)."""
    xf = as_dtype(x, "fp32")
    ms = mb.reduce_mean(x=mb.mul(x=xf, y=xf), axes=[-1], keep_dims=True)
    normed = mb.mul(x=xf, y=mb.rsqrt(x=mb.add(x=ms, y=np.float32(eps))))
    w = weight.astype(np.float16 if act == "fp16" else np.float32)
    return mb.mul(x=as_dtype(normed, act), y=w)


def rope_tables(pos: Var, inv_freq: Var | np.ndarray, scale: float) -> tuple[Var, Var]:
    """(cos, sin) fp32 [T, D]: angles = pos * inv_freq in fp32, duplicated (rotate-half layout)
    and multiplied by the LongRoPE attention `scale`. `inv_freq` fp32 [D/2]."""
    angles = mb.mul(x=mb.expand_dims(x=as_dtype(pos, "fp32"), axes=[1]),
                    y=mb.expand_dims(x=inv_freq, axes=[0]))            # [T, D/2]
    emb = mb.concat(values=[angles, angles], axis=-1)
    return (mb.mul(x=mb.cos(x=emb), y=np.float32(scale)),
            mb.mul(x=mb.sin(x=emb), y=np.float32(scale)))


def rope(x: Var, cos: Var, sin: Var, head_dim: int) -> Var:
    """x [1, H, T, D] -> rotated, in x's dtype: `x * cos + rotate_half(x) * sin`, dim i paired
    with i + D/2 (arkinfer::rope), computed in fp32."""
    xf = as_dtype(x, "fp32")
    half = head_dim // 2
    x1 = mb.slice_by_index(x=xf, begin=[0, 0, 0, 0], end=[0, 0, 0, half],
                           end_mask=[True, True, True, False])
    x2 = mb.slice_by_index(x=xf, begin=[0, 0, 0, half], end=[0, 0, 0, 0],
                           end_mask=[True, True, True, True])
    rotated = mb.concat(values=[mb.mul(x=x2, y=np.float32(-1.0)), x1], axis=-1)
    out = mb.add(x=mb.mul(x=xf, y=cos), y=mb.mul(x=rotated, y=sin))
    return as_dtype(out, _dtype_name(x))


def positions(start: Var, t: Var | int) -> Var:
    """int32 [T]: start .. start + T - 1 (`start` int32 [1], `t` the token count)."""
    s = mb.squeeze(x=start, axes=[0]) if start.rank == 1 else start
    return mb.range_1d(start=s, end=mb.add(x=s, y=t), step=np.int32(1))


def causal_mask(pos: Var, length: int) -> Var:
    """bool [T, length]: key j is visible to the query at absolute position pos[i] iff j <= pos[i]
    (keys past the valid cache are therefore never seen)."""
    keys = np.arange(length, dtype=np.int32)[None, :]
    return mb.less_equal(x=keys, y=mb.expand_dims(x=pos, axes=[1]))


def group_queries(q: Var, hkv: int, group: int, t: Var | int, head_dim: int) -> Var:
    """q [1, Hq, T, D] -> [1, Hkv, G*T, D]: query head h = g*G + j belongs to KV group g."""
    return mb.reshape(x=q, shape=[1, hkv, -1, head_dim]) if group > 1 else q


def ungroup(out: Var, hq: int, head_dim: int) -> Var:
    """[1, Hkv, G*T, D] -> [1, Hq, T, D] (inverse of `group_queries`)."""
    return mb.reshape(x=out, shape=[1, hq, -1, head_dim])


def attention(q: Var, k: Var, v: Var, pos: Var, scale: float, act: str) -> Var:
    """Dense causal GQA over the whole state (arkinfer::attention).

    q [1, Hq, T, D]; k, v [1, Hkv, Smax, D]; pos int32 [T] -> [1, Hq, T, D] in `act`.
    Logits, mask and softmax in fp32; a key j is used by query i iff j <= pos[i]."""
    _, hq, _, d = q.shape
    hkv, smax = k.shape[1], k.shape[2]
    group = hq // hkv
    qg = as_dtype(group_queries(q, hkv, group, -1, d), "fp32")                   # [1,Hkv,G*T,D]
    logits = mb.matmul(x=mb.mul(x=qg, y=np.float32(scale)), y=as_dtype(k, "fp32"),
                       transpose_y=True)                                          # [1,Hkv,G*T,S]
    logits = mb.reshape(x=logits, shape=[1, hkv, group, -1, smax])               # [1,Hkv,G,T,S]
    mask = causal_mask(pos, smax)                                                 # [T, S]
    logits = mb.select(cond=mask, a=logits, b=np.float32(MASKED))
    probs = mb.reshape(x=mb.softmax(x=logits, axis=-1), shape=[1, hkv, -1, smax])
    out = mb.matmul(x=probs, y=as_dtype(v, "fp32"))                               # [1,Hkv,G*T,D]
    return as_dtype(ungroup(out, hq, d), act)
