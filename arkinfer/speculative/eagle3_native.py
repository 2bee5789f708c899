"""The EAGLE-3 head's one-token step in C (eagle3_step.c, compiled once per machine like
ArkInfer's other kernels): the chain's draft steps 2..k, where PyTorch's per-operator overhead
is most of the work (~0.6 ms a step on the demo's head, a few microseconds here).

    step = native_step(head)                 # None where the library cannot be built
    hidden, logits, best = step(embed, hidden, position, cache)   # [1, H], [Vd], argmax id

It computes what `Eagle3Head.forward` computes for one token (same float32 weights, another
summation order: logits agree to ~1e-5) and appends the token's k, v to the same `Eagle3Cache`
in place, so PyTorch steps and native steps mix freely.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import Tensor

_F = ctypes.POINTER(ctypes.c_float)
WEIGHT_FIELDS = ("input_norm", "hidden_norm", "wq", "wk", "wv", "wo", "post_norm", "gate", "up",
                 "down", "norm", "lm_head", "inv_freq")
MAX_KV_WIDTH = 1024  # nkv * head_dim the C step's stack buffers hold


class _Weights(ctypes.Structure):
    _fields_ = [("hidden", ctypes.c_int32), ("heads", ctypes.c_int32),
                ("kv_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32),
                ("inter", ctypes.c_int32), ("vocab", ctypes.c_int32), ("eps", ctypes.c_float),
                ("pad", ctypes.c_int32), *[(name, _F) for name in WEIGHT_FIELDS]]


#: reassociation lets the compiler vectorise the dot products' sums (no finite-math assumption)
REDUCTION_FLAGS = ["-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math"]


def _library():
    from arkinfer.native_build import FLAGS, NativeBuildError, load_library

    try:
        lib = load_library("eagle3_step", [Path(__file__).with_name("eagle3_step.c")],
                           [*FLAGS, *REDUCTION_FLAGS])
    except NativeBuildError:
        return None
    if lib is not None:
        lib.eagle3_step.restype = ctypes.c_int64
        # the buffers go as plain addresses (tensor.data_ptr()): no ctypes cast per call
        lib.eagle3_step.argtypes = [ctypes.POINTER(_Weights), ctypes.c_void_p, ctypes.c_void_p,
                                    ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                    ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                    ctypes.c_void_p, ctypes.c_void_p]
    return lib


def _ptr(t: Tensor):
    return ctypes.cast(t.data_ptr(), _F)


class NativeStep:
    """The C step over `head`'s weights (float32 contiguous copies are kept alive here)."""

    def __init__(self, lib, head) -> None:
        cfg, layer = head.config, head.midlayer
        attn, mlp = layer.self_attn, layer.mlp
        tensors = {"input_norm": layer.input_layernorm.weight,
                   "hidden_norm": layer.hidden_norm.weight, "wq": attn.q_proj.weight,
                   "wk": attn.k_proj.weight, "wv": attn.v_proj.weight, "wo": attn.o_proj.weight,
                   "post_norm": layer.post_attention_layernorm.weight,
                   "gate": mlp.gate_proj.weight, "up": mlp.up_proj.weight,
                   "down": mlp.down_proj.weight, "norm": head.norm.weight,
                   "lm_head": head.lm_head.weight, "inv_freq": layer.inv_freq}
        self._keep = {n: t.detach().float().contiguous() for n, t in tensors.items()}
        self.lib, self.cfg = lib, cfg
        # scratch: 2H + 2 nh hd + 2I floats, plus one score per cached position
        self._fixed = 2 * cfg.hidden_size + 2 * cfg.num_attention_heads * cfg.head_dim \
            + 2 * cfg.intermediate_size
        self._scratch = torch.empty(0)
        self.weights = _Weights(cfg.hidden_size, cfg.num_attention_heads,
                                cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size,
                                cfg.draft_vocab_size, cfg.rms_norm_eps, 0,
                                *[_ptr(self._keep[n]) for n in WEIGHT_FIELDS])
        self._weights_ref = ctypes.byref(self.weights)

    def __call__(self, embed: Tensor, hidden: Tensor, position: int, cache
                 ) -> tuple[Tensor, Tensor, int]:
        """embed, hidden [1, H] or [H] float32 -> (hidden_out [1, H], logits [Vd], argmax);
        appends the position to `cache` (which must hold `position` rows)."""
        cfg = self.cfg
        cache.reserve(cache.length + 1)
        embed = embed.reshape(-1).float().contiguous()
        hidden = hidden.reshape(-1).float().contiguous()
        out = torch.empty(cfg.hidden_size)  # new tensors: the caller keeps them
        logits = torch.empty(cfg.draft_vocab_size)
        need = self._fixed + cache._k.shape[1]
        if self._scratch.numel() < need:
            self._scratch = torch.empty(need)
        scratch = self._scratch
        best = self.lib.eagle3_step(self._weights_ref, embed.data_ptr(), hidden.data_ptr(),
                                    position, cache._k.data_ptr(), cache._v.data_ptr(),
                                    cache._k.shape[1], cache.length, out.data_ptr(),
                                    logits.data_ptr(), scratch.data_ptr())
        cache.length += 1
        return out[None], logits, int(best)


def native_step(head) -> NativeStep | None:
    """The C step for `head`, or None where it cannot run (no compiler or CPU support, a KV
    width over MAX_KV_WIDTH)."""
    cfg = head.config
    if cfg.num_key_value_heads * cfg.head_dim > MAX_KV_WIDTH or \
            cfg.num_attention_heads % cfg.num_key_value_heads:
        return None
    lib = _library()
    return None if lib is None else NativeStep(lib, head)
