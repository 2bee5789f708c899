"""The weights a lowering reads from `LowerRequest.model_dir`: float tensors, and quantised linears
in the folder's own layout (gptq / marlin / awq tensors, unpacked nowhere: they go into the ONNX
graph as they are stored, and the arkinfer-domain functions unpack them).

    src = FolderWeights(model_dir)
    src.quantised("model.layers.0.mlp.up_proj.weight")  -> QuantLinear | None
    src.tensor("model.norm.weight")                     -> torch tensor (its stored dtype)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from arkinfer.quant.formats import get_format
from arkinfer.quant.load import format_of
from arkinfer.quant.weight import QuantizedWeight
from onnx import TensorProto

from arkinfer.errors import NotAvailableError
from arkinfer.frontend.checkpoint import open_checkpoint

# formats whose tensors an arkinfer-domain function consumes as stored
FUNCTION_FORMATS = ("marlin", "gptq", "awq")
_FLOAT = ("F32", "F16", "BF16", "F64")


@dataclass
class QuantLinear:
    """One packed linear: `tensors` keyed by the format's suffixes (B, s / qweight, qzeros, ...)."""

    owner: str
    format: str
    tensors: dict[str, np.ndarray]
    out_features: int
    in_features: int
    params: dict[str, Any]

    def canonical(self) -> QuantizedWeight:
        """The canonical weight (numpy unpack reference of the format)."""
        return get_format(self.format).unpack(self.tensors, self.out_features, self.in_features,
                                              **self.params)


class FolderWeights:
    """Tensors of a (quantised or float) Hugging Face folder, read lazily."""

    def __init__(self, folder: str | Path) -> None:
        self.ckpt = open_checkpoint(folder, with_tokenizer=False)
        self.raw = self.ckpt.raw_config
        qcfg = self.raw.get("quantization_config")
        self.format, self.params = format_of(qcfg) if isinstance(qcfg, dict) else (None, {})
        if self.format is not None and self.format not in FUNCTION_FORMATS:
            raise NotAvailableError(
                f"the onnx and tensorrt backends lower marlin, gptq and awq checkpoints, not "
                f"{self.format!r} ({self.ckpt.path})",
                hint="quantise with --quant marlin, gptq or awq (or build float with --quant f16)")
        self._owners = self._packed_owners()

    def _packed_owners(self) -> dict[str, list[str]]:
        keys: dict[str, list[str]] = {}
        for name in self.ckpt.weights.names():
            owner, _, key = name.rpartition(".")
            if owner and key not in ("weight", "bias"):
                keys.setdefault(owner, []).append(key)
        return keys

    def quantised(self, weight_name: str, shape: tuple[int, ...]) -> QuantLinear | None:
        """The packed linear stored for `<owner>.weight` of logical shape [out, in], or None."""
        owner = weight_name.removesuffix(".weight")
        if owner == weight_name or owner not in self._owners:
            return None
        tensors = {k: self.ckpt.weights.get(f"{owner}.{k}").numpy() for k in self._owners[owner]}
        return QuantLinear(owner, str(self.format), tensors, int(shape[0]), int(shape[1]),
                           dict(self.params))

    def tensor(self, name: str) -> torch.Tensor:
        return self.ckpt.weights.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self.ckpt.weights


def tensor_proto(name: str, t: torch.Tensor | np.ndarray, dtype: str | None = None) -> TensorProto:
    """A TensorProto with raw data; torch floats are converted to `dtype` ("f32", "f16", "bf16")
    first (bf16 is written as its raw 16-bit patterns: numpy has no bfloat16)."""
    proto = TensorProto()
    proto.name = name
    if isinstance(t, torch.Tensor):
        if dtype is not None and t.is_floating_point():
            t = t.to({"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype])
        if t.dtype == torch.bfloat16:
            proto.data_type = TensorProto.BFLOAT16
            proto.dims.extend(t.shape)
            proto.raw_data = t.contiguous().view(torch.int16).numpy().tobytes()
            return proto
        t = t.contiguous().numpy()
    arr = np.ascontiguousarray(t)
    types = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
             np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int64): TensorProto.INT64,
             np.dtype(np.uint8): TensorProto.UINT8}
    proto.data_type = types[arr.dtype]
    proto.dims.extend(arr.shape)
    proto.raw_data = arr.tobytes()
    return proto
