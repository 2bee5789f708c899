"""ggml's block types as data: the type ids ArkInfer writes and each one's block geometry.

    GGMLType.Q4_K                 # 12, gguf's GGMLQuantizationType
    BLOCK[GGMLType.Q4_K]          # (256, 144): weights per block, bytes per block

Below both users, the numpy codecs (gguf_blocks.py, which re-exports these names) and ggml's own
quantisers (ggml_native.py, which gguf_blocks calls), so neither imports the other for them.
"""

from __future__ import annotations

from enum import IntEnum


class GGMLType(IntEnum):
    """ggml type ids (gguf `GGMLQuantizationType`) of the block types ArkInfer writes."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    IQ4_NL = 20
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35


# (weights per block, bytes per block)
BLOCK: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4), GGMLType.F16: (1, 2), GGMLType.BF16: (1, 2),
    GGMLType.Q4_0: (32, 18), GGMLType.Q4_1: (32, 20), GGMLType.Q8_0: (32, 34),
    GGMLType.Q5_0: (32, 22), GGMLType.Q5_1: (32, 24), GGMLType.Q4_K: (256, 144),
    GGMLType.Q5_K: (256, 176), GGMLType.Q6_K: (256, 210), GGMLType.IQ4_NL: (32, 18),
    GGMLType.TQ1_0: (256, 54), GGMLType.TQ2_0: (256, 66),
}
