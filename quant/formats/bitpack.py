"""Bit packing shared by the formats (numpy): codes as a little-endian bit stream.

`pack_bits(v, bits, word_bits, axis)` packs unsigned `bits`-bit values along `axis` into words of
`word_bits` (8 → uint8, 32 → uint32): value i occupies stream bits [i*bits, (i+1)*bits), stream
bit j is bit (j % word_bits) of word j // word_bits. When `word_bits % bits == 0` this is simply
"word m holds values m*per .. m*per+per-1, the first in the least significant bits"; for 3-bit
it reproduces AutoGPTQ's packing of 32 values into 3 int32 words across word boundaries.
"""

from __future__ import annotations

import numpy as np

_WORD = {8: np.uint8, 16: np.uint16, 32: np.uint32}


def pack_bits(values: np.ndarray, bits: int, word_bits: int = 32, axis: int = -1) -> np.ndarray:
    """Pack along `axis`: [..., n, ...] -> [..., n*bits/word_bits, ...] of uint8/16/32."""
    word = _WORD[word_bits]
    v = np.moveaxis(np.asarray(values), axis, -1)
    n = v.shape[-1]
    if (n * bits) % word_bits:
        raise ValueError(f"{n} values of {bits} bits do not fill whole {word_bits}-bit words")
    lead = v.shape[:-1]
    if word_bits % bits == 0:
        # Disjoint bit fields: summing the shifted values is OR-ing them, in the word dtype.
        per = word_bits // bits
        shifts = np.arange(per, dtype=word) * word(bits)
        words = (v.astype(word).reshape(*lead, n // per, per) << shifts).sum(axis=-1, dtype=word)
        return np.moveaxis(words, -1, axis)
    # Fields cross word boundaries (3-bit): go through the bit stream itself.
    v = v.astype(np.uint64)
    stream = (v[..., None] >> np.arange(bits, dtype=np.uint64)) & np.uint64(1)
    stream = stream.reshape(*lead, n * bits // word_bits, word_bits)
    words = (stream << np.arange(word_bits, dtype=np.uint64)).sum(axis=-1, dtype=np.uint64)
    return np.moveaxis(words.astype(word), -1, axis)


def unpack_bits(words: np.ndarray, bits: int, n: int, axis: int = -1) -> np.ndarray:
    """Inverse of pack_bits: words along `axis` -> `n` uint8 values along `axis`."""
    w = np.moveaxis(np.asarray(words), axis, -1)
    word_bits = w.dtype.itemsize * 8
    word = _WORD[word_bits]
    w = w.view(word)
    lead = w.shape[:-1]
    if word_bits % bits == 0:
        per = word_bits // bits
        shifts = np.arange(per, dtype=word) * word(bits)
        vals = ((w[..., None] >> shifts) & word((1 << bits) - 1)).reshape(*lead, -1)
    else:
        w = w.astype(np.uint64)
        stream = ((w[..., None] >> np.arange(word_bits, dtype=np.uint64)) & np.uint64(1))
        stream = stream.reshape(*lead, -1, bits)
        vals = (stream << np.arange(bits, dtype=np.uint64)).sum(axis=-1, dtype=np.uint64)
    if vals.shape[-1] < n:
        raise ValueError(f"{w.shape[-1]} words of {word_bits} bits hold fewer than {n} values")
    return np.moveaxis(vals[..., :n].astype(np.uint8), -1, axis)
