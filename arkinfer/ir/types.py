"""Typed values: a dtype and a shape of (possibly symbolic) dims, e.g. `bf16[1,T,4096]`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch

from arkinfer.ir import dims
from arkinfer.ir.dims import Dim
from arkinfer.ir.errors import IRVerifyError


class DType(StrEnum):
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    I64 = "i64"
    I32 = "i32"
    I8 = "i8"
    U8 = "u8"
    BOOL = "bool"

    @property
    def torch(self) -> torch.dtype:
        return _TO_TORCH[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F16, DType.BF16)

    @classmethod
    def from_torch(cls, dtype: torch.dtype) -> DType:
        for k, v in _TO_TORCH.items():
            if v == dtype:
                return k
        raise IRVerifyError(f"torch dtype {dtype} has no IR dtype",
                          hint=f"supported: {', '.join(d.value for d in cls)}")

    @classmethod
    def parse(cls, text: str) -> DType:
        try:
            return cls(text)
        except ValueError:
            raise IRVerifyError(f"dtype {text!r} is not an IR dtype",
                              hint=f"use one of {', '.join(d.value for d in cls)}") from None


_TO_TORCH = {DType.F32: torch.float32, DType.F16: torch.float16, DType.BF16: torch.bfloat16,
             DType.I64: torch.int64, DType.I32: torch.int32, DType.I8: torch.int8,
             DType.U8: torch.uint8, DType.BOOL: torch.bool}


@dataclass(frozen=True)
class TensorType:
    """dtype + shape; shape entries are ints or dim expressions over named dims ("T", "P+T")."""

    dtype: DType
    shape: tuple[Dim, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DType(self.dtype))
        object.__setattr__(self, "shape", tuple(dims.canon(d) for d in self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def same_as(self, other: TensorType) -> bool:
        return (self.dtype == other.dtype and self.rank == other.rank
                and all(dims.equal(a, b) for a, b in zip(self.shape, other.shape)))

    def symbols(self) -> set[str]:
        return set().union(*[dims.symbols(d) for d in self.shape]) if self.shape else set()

    def concrete(self, env: dict[str, int]) -> tuple[int, ...]:
        return tuple(dims.evaluate(d, env) for d in self.shape)

    def with_shape(self, shape: tuple[Dim, ...] | list[Dim]) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(dtype, self.shape)

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(str(d) for d in self.shape)}]"

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype.value, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorType:
        return cls(DType.parse(data["dtype"]), tuple(data["shape"]))

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorType:
        return cls(DType.from_torch(tensor.dtype), tuple(int(s) for s in tensor.shape))
