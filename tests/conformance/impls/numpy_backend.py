"""The `numpy` test backend's own InfLLM v2 (tests/backends/e2e/numpy_backend/infllmv2.py), run
through torch <-> numpy conversion: the conformance adapter a backend from outside ArkInfer
brings. The backend's package is imported the way the e2e suite imports it, from its folder on
sys.path; nothing in arkinfer/ or backends/ knows it.

Inputs cross as fp32 (bf16 widens exactly), the op computes in fp32 and the output is rounded to
q's dtype here, as the reference rounds its fp32 result. The compressed-key state crosses as fp32
(exact). Allocations happen in numpy, invisible to torch, and the dense path is numpy's own
arithmetic, so the no-L^2 check and the bit-exact dense check do not apply (dense is compared
with tolerance).
"""

import sys
from pathlib import Path

import numpy as np
import torch
from infllmv2_checks import Infllmv2Impl

from arkinfer.ops.infllmv2.common import CompressedKeys

E2E_DIR = Path(__file__).resolve().parents[2] / "backends" / "e2e"   # holds numpy_backend/
sys.path.insert(0, str(E2E_DIR))
try:
    from numpy_backend import infllmv2 as numpy_infllmv2
finally:
    sys.path.remove(str(E2E_DIR))


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().float().numpy()


def _keys_np(state: CompressedKeys | None) -> "numpy_infllmv2.Keys | None":
    if state is None:
        return None
    return numpy_infllmv2.Keys(_np(state.fine), _np(state.coarse), state.length)


def _keys_torch(keys: "numpy_infllmv2.Keys") -> CompressedKeys:
    return CompressedKeys(torch.from_numpy(keys.fine), torch.from_numpy(keys.coarse), keys.length)


def attention(q, k, v, *, config, scale, cache_len, state=None, q_sel=None, k_sel=None):
    given = _keys_np(state)
    out, keys, idx = numpy_infllmv2.infllmv2_attention(
        _np(q), _np(k), _np(v), config=config, scale=scale, cache_len=cache_len, state=given,
        q_sel=_np(q_sel), k_sel=_np(k_sel))
    # A dense call hands the incoming state back untouched: return the caller's own object.
    new_state = state if keys is given else _keys_torch(keys)
    idx = None if idx is None else torch.from_numpy(idx)
    return torch.from_numpy(out).to(q.dtype), new_state, idx


def stage2(q, k, v, idx, *, config, scale, cache_len):
    out = numpy_infllmv2.block_sparse_attention(_np(q), _np(k), _np(v), idx.numpy(),
                                                config=config, scale=scale, cache_len=cache_len)
    return torch.from_numpy(out).to(q.dtype)


IMPL = Infllmv2Impl("numpy_backend", attention, stage2=stage2, tracks_memory=False,
                    exact_dense=False)
