"""The mlx backend's InfLLM v2 (backends/mlx/infllmv2.py, MLX ops on mlx[cpu] here), run through
torch <-> MLX conversion. The compressed-key state crosses as fp32 (exact), so the incremental
state is carried by MLX between calls just as the MLX runtime carries it in its KV cache.

Allocations happen inside MLX (invisible to torch), and the dense path is MLX's own SDPA kernel,
so the no-L^2 check and the bit-exact dense check do not apply (dense is compared with tolerance).
The Metal decode kernel is not exercised (no Metal here): see backends/mlx/README.md.
"""

import numpy as np
import torch
from infllmv2_checks import Infllmv2Impl

try:  # an ImportError here is reported by conftest.py as a skip with this reason
    import mlx.core as mx
except ImportError as exc:
    raise ImportError(f"mlx is not importable ({exc}): pip install 'arkinfer[mlx]'") from None

from arkinfer.backends.mlx import infllmv2 as mlx_infllmv2  # noqa: E402

from arkinfer.ops.infllmv2.common import CompressedKeys  # noqa: E402


def _mx(t: torch.Tensor | None):
    if t is None:
        return None
    a = mx.array(t.detach().float().numpy())
    return a.astype(mx.bfloat16) if t.dtype == torch.bfloat16 else \
        a.astype(mx.float16) if t.dtype == torch.float16 else a


def _torch(a, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.array(a.astype(mx.float32))).to(dtype)


def _state_to_mx(state: CompressedKeys | None) -> CompressedKeys | None:
    if state is None:
        return None
    return CompressedKeys(_mx(state.fine), _mx(state.coarse), state.length)


def _state_to_torch(state: CompressedKeys | None) -> CompressedKeys | None:
    if state is None:
        return None
    return CompressedKeys(_torch(state.fine, torch.float32), _torch(state.coarse, torch.float32),
                          state.length)


def attention(q, k, v, *, config, scale, cache_len, state=None, q_sel=None, k_sel=None):
    out, new_state, idx = mlx_infllmv2.infllmv2_attention(
        _mx(q), _mx(k), _mx(v), config=config, scale=scale, cache_len=cache_len,
        state=_state_to_mx(state), q_sel=_mx(q_sel), k_sel=_mx(k_sel))
    idx_t = None if idx is None else torch.from_numpy(np.array(idx)).to(torch.int64)
    return _torch(out, q.dtype), _state_to_torch(new_state), idx_t


def stage2(q, k, v, idx, *, config, scale, cache_len):
    out = mlx_infllmv2.block_sparse_attention(_mx(q), _mx(k), _mx(v),
                                              mx.array(idx.numpy().astype(np.int32)),
                                              config=config, scale=scale, cache_len=cache_len)
    return _torch(out, q.dtype)


IMPL = Infllmv2Impl("mlx", attention, stage2=stage2, tracks_memory=False, exact_dense=False)
