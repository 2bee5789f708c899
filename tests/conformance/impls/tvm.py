"""The tvm backend's InfLLM v2 (backends/tvm/kernels_infllmv2.py + the stage-2 mask in
kernels_attention.py, emitted by backends/tvm/infllmv2.py exactly as the model lowering emits
them), compiled for llvm and run through TVM's Relax VM.

- One module is compiled per (Hq, Hkv, head_dim, config without dense_len, scale), any batch
  and length (about 8 s each, cached for the session).
- The kernels are fp32: bf16 inputs are widened exactly and the output is rounded back, as the
  reference does around its fp32 arithmetic.
- Stateless like the model lowering (the IR's KV cache is functional): every call compresses
  the whole cache, and the returned state holds the module's own compressed keys. A dense call
  returns the incoming state untouched, as the reference does.
- Stage 2 is masked dense attention over the cache (O(T * S) scores), so queries run in chunks
  of 1024 against the keys they can see (the reference chunks the same way); a single query
  (decode) runs the host model module's block gather instead (kernels_sparse_decode.py, the
  module's `decode` function). The dense/sparse switch is decided once for the whole call. No
  torch-visible allocations, no stage-2-only entry.
"""


# Heavy (make test-all; `pytest tests/conformance -k tvm -m heavy`): every check compiles TVM modules and runs stage 2 masked-dense (O(T*S)), ~10 min;
# one pytest process running every implementation's checks outgrew this machine's 24 GB.
# CI runs the backend's own InfLLM v2 tests instead (tests/backends/tvm/test_tvm_infllmv2.py).
HEAVY = True

import numpy as np
import torch
from infllmv2_checks import Infllmv2Impl

try:  # an ImportError here is reported by conftest.py as a skip with this reason
    import tvm  # noqa: F401
except ImportError as exc:
    raise ImportError(f"tvm is not importable ({exc}): pip install 'arkinfer[tvm]'") from None

from dataclasses import replace  # noqa: E402

from arkinfer.backends.tvm.infllmv2 import InfLLMv2Module  # noqa: E402
from arkinfer.ops.infllmv2.common import CompressedKeys, check_inputs  # noqa: E402

_CHUNK = 1024
_MODULES: dict[tuple, InfLLMv2Module] = {}


def _module(hq: int, hkv: int, dim: int, config, scale: float) -> InfLLMv2Module:
    key = (hq, hkv, dim, replace(config, dense_len=-1), float(scale))
    if key not in _MODULES:
        _MODULES[key] = InfLLMv2Module(hq, hkv, dim, key[3], float(scale))
    return _MODULES[key]


def attention(q, k, v, *, config, scale, cache_len, state=None, q_sel=None, k_sel=None):
    check_inputs(q, k, v, cache_len, config, state, q_sel, k_sel)
    sparse = not config.is_dense(k.shape[2])
    mod = _module(q.shape[1], k.shape[1], q.shape[3], config, scale)
    qn, kn, vn = (t.float().numpy() for t in (q, k, v))
    outs, idxs = [], []
    for lo in range(0, q.shape[2], _CHUNK):
        hi = min(lo + _CHUNK, q.shape[2])
        end = cache_len + hi
        out, idx, fine, coarse = mod.run(qn[:, :, lo:hi], kn[:, :, :end], vn[:, :, :end], sparse)
        outs.append(out)
        idxs.append(idx)
    out = torch.from_numpy(np.concatenate(outs, 2)).to(q.dtype)
    if not sparse:
        return out, state, None
    keys = CompressedKeys(torch.from_numpy(fine), torch.from_numpy(coarse), k.shape[2])
    return out, keys, torch.from_numpy(np.concatenate(idxs, 2))


IMPL = Infllmv2Impl("tvm", attention, tracks_memory=False, sparse_is_fast=False,
                    exact_dense=False)
