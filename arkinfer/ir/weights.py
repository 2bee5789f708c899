"""The weight store: tensors kept outside the graph and referenced by name from op attributes.

A weight has a logical type (the float tensor a `linear` multiplies by: [out, in]), its data
(a tensor, or a loader that produces it on first use, e.g. memory-mapped from the checkpoint;
a `meta` tensor when the program was traced shape-only) and optionally a quant annotation that
says how a backend must store it. Quantised codes themselves arrive from `arkinfer.quant`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from arkinfer.ir.errors import IRError, IRVerifyError
from arkinfer.ir.types import TensorType

QUANT_BITS = (2, 3, 4, 5, 6, 8)


@dataclass(frozen=True)
class QuantSpec:
    """How a weight is (to be) quantised: bits, group size along `in` (-1: one group per row),
    storage format name (e.g. "gptq", "marlin", "gguf-q4_0") and symmetric or not."""

    bits: int
    group_size: int
    format: str
    sym: bool

    def __post_init__(self) -> None:
        if self.bits not in QUANT_BITS:
            raise IRVerifyError(f"quant bits={self.bits} is not supported",
                              hint=f"use one of {QUANT_BITS}")
        if self.group_size != -1 and self.group_size <= 0:
            raise IRVerifyError(f"quant group_size={self.group_size} must be positive or -1 (per row)")
        if not self.format:
            raise IRVerifyError("quant format must name a storage format, e.g. 'gptq'")

    def to_json(self) -> dict[str, Any]:
        return {"bits": self.bits, "group_size": self.group_size, "format": self.format,
                "sym": self.sym}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QuantSpec:
        return cls(int(data["bits"]), int(data["group_size"]), str(data["format"]), bool(data["sym"]))


class Weight:
    """One named tensor of the store: its type, its data (or loader) and its quant annotation."""

    def __init__(self, name: str, type: TensorType, data: torch.Tensor | None = None,
                 loader: Callable[[], torch.Tensor] | None = None,
                 quant: QuantSpec | None = None) -> None:
        if not type.is_static:
            raise IRVerifyError(f"weight '{name}' has symbolic shape {type}; weights are static")
        self.name, self.type, self.quant = name, type, quant
        self._data, self._loader = data, loader

    @property
    def has_data(self) -> bool:
        """False for shape-only weights (meta tensors, or no data at all)."""
        if self._data is not None:
            return not self._data.is_meta
        return self._loader is not None

    def tensor(self) -> torch.Tensor:
        """The data (loaded and kept on first use)."""
        if self._data is None and self._loader is not None:
            self._data = self._loader()
            self._loader = None
            if TensorType.of(self._data) != self.type:
                raise IRError(f"weight '{self.name}' loaded as {TensorType.of(self._data)}, the "
                              f"program expects {self.type}", hint="the weights come from a "
                              "different model than the graph; trace again")
        if self._data is None or self._data.is_meta:
            raise IRError(f"weight '{self.name}' has no data: the program was traced shape-only",
                          hint="trace from a checkpoint folder or a loaded model to run it")
        return self._data

    def meta(self) -> torch.Tensor:
        """A meta tensor of the weight's type (never loads data)."""
        return torch.empty(self.type.concrete({}), dtype=self.type.dtype.torch, device="meta")

    def __repr__(self) -> str:
        q = f" quant={self.quant}" if self.quant else ""
        return f"Weight({self.name!r}, {self.type}{q})"


class WeightStore:
    """Name -> Weight; shared by every entry point of a program."""

    def __init__(self, weights: dict[str, Weight] | None = None) -> None:
        self._weights: dict[str, Weight] = dict(weights or {})

    def add(self, weight: Weight) -> Weight:
        if weight.name in self._weights:
            raise IRVerifyError(f"weight '{weight.name}' is already in the store")
        self._weights[weight.name] = weight
        return weight

    def remove(self, name: str) -> None:
        del self._weights[name]

    def __getitem__(self, name: str) -> Weight:
        try:
            return self._weights[name]
        except KeyError:
            raise IRError(f"weight '{name}' is not in the weight store",
                          hint="run verify(program) to list every dangling reference") from None

    def __contains__(self, name: object) -> bool:
        return name in self._weights

    def __iter__(self) -> Iterator[Weight]:
        return iter(self._weights.values())

    def __len__(self) -> int:
        return len(self._weights)

    def names(self) -> list[str]:
        return list(self._weights)

    def tensor(self, name: str) -> torch.Tensor:
        return self[name].tensor()

    def copy(self) -> WeightStore:
        """A new store holding the same Weight objects (passes add and remove names freely)."""
        return WeightStore(self._weights)

    def num_elements(self) -> int:
        total = 0
        for w in self:
            n = 1
            for d in w.type.shape:
                n *= int(d)
            total += n
        return total
