"""InfLLM v2 trainable sparse attention (MiniCPM4 / MiniCPM4.1), docs/infllmv2.md.

`infllmv2_attention` is the fast CPU implementation a model calls per layer;
`arkinfer.ops.infllmv2.reference` holds the literal reference every implementation is judged by
(tests/conformance). Both share `SparseConfig`, `CompressedKeys`, the compression and the dense path.
"""

from arkinfer.ops.infllmv2.common import CompressedKeys, dense_attention, n_kernels
from arkinfer.ops.infllmv2.compress import compress_keys, reserve_room, update_compressed
from arkinfer.ops.infllmv2.config import SparseConfig
from arkinfer.ops.infllmv2.fast import (
    block_sparse_attention,
    infllmv2_attention,
    select_blocks,
)

__all__ = ["CompressedKeys", "SparseConfig", "block_sparse_attention", "compress_keys",
           "dense_attention", "infllmv2_attention", "n_kernels", "reserve_room",
           "select_blocks", "update_compressed"]
