"""The target's hidden states an EAGLE-3 head reads ("taps"), kept beside the runner's KV cache.

A tap `i` is the residual stream at the INPUT of decoder layer i (the output of layer i - 1, before
any norm): SGLang's `eagle_aux_hidden_state_layer_ids` convention, 1 <= i <= L - 1. A runner that
records taps (`enable_taps(layers)`) keeps one row per cached position, the taps side by side:

    rows [S, len(layers) * H] float32, row p = cat(tap_layers[0](p), tap_layers[1](p), ...)

and cuts them with its cache (`truncate(n)` keeps rows :n, `reset()` empties them), so row p always
describes cached position p. The reference, gguf, mlx and onnx runners record taps.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from arkinfer.errors import ArkError


def check_tap_layers(layers: Sequence[int], total: int, where: str) -> tuple[int, ...]:
    """`layers` as a tuple after checking 1 <= i <= total - 1 for each (ArkError naming the bad
    one, the model's layer count and the valid range)."""
    layers = tuple(int(i) for i in layers)
    if not layers:
        raise ArkError(f"no tap layers given for {where}", hint="e.g. taps at layers (1, 2, 3)")
    for i in layers:
        if not 1 <= i <= total - 1:
            raise ArkError(f"tap layer {i} does not exist in {where}: it has {total} layers, so a "
                           f"tap (the input of layer i) must be 1..{total - 1}",
                           hint="use a draft head trained for this model")
    return layers


class HiddenTaps:
    """Rows of taps for the cached positions of one runner (module docstring)."""

    def __init__(self, layers: tuple[int, ...]) -> None:
        self.layers = layers
        self._rows: list[Tensor] = []  # chunks [T, len(layers) * H], in position order
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    def append(self, per_layer: Sequence[Tensor]) -> None:
        """Add T positions: per_layer[j] [T, H] is tap layers[j] for each of them."""
        if len(per_layer) != len(self.layers):
            raise ArkError(f"{len(per_layer)} tap tensors for {len(self.layers)} tap layers",
                           hint="this is a bug in the runner recording the taps")
        chunk = torch.cat([t.reshape(t.shape[-2], t.shape[-1]).float() for t in per_layer], dim=-1)
        self._rows.append(chunk)
        self._length += chunk.shape[0]

    def rows(self, start: int = 0, stop: int | None = None) -> Tensor:
        """Rows [stop - start, len(layers) * H] of cached positions start..stop-1."""
        stop = self._length if stop is None else stop
        if not 0 <= start <= stop <= self._length:
            raise ArkError(f"tap rows {start}..{stop} asked of {self._length} recorded",
                           hint="the draft and the target's cache went out of step")
        if len(self._rows) > 1:
            self._rows = [torch.cat(self._rows)]
        return self._rows[0][start:stop] if self._rows else torch.zeros(0, 0)

    def truncate(self, n: int) -> None:
        """Keep the rows of the first n positions."""
        if n < self._length:
            self._rows = [self.rows(0, n)]
            self._length = n

    def clear(self) -> None:
        self._rows, self._length = [], 0


class RecordsTaps:
    """Mixin of the runners that record taps: `taps` (their `_taps`, None while not recording)."""

    _taps: HiddenTaps | None = None

    @property
    def taps(self) -> HiddenTaps:
        if self._taps is None:
            raise ArkError("this runner records no taps", hint="call enable_taps(layers) first")
        return self._taps
