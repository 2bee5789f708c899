"""The weights the ONNX lowering reads from `LowerRequest.model_dir`: float tensors, and quantised
linears in the folder's own layout (gptq / marlin / awq tensors, unpacked nowhere: they go into
the ONNX graph as they are stored, and the arkinfer-domain functions unpack them).

    src = FolderWeights(model_dir)     # arkinfer.lowering.source_weights.SourceWeights, limited
                                       # to FUNCTION_FORMATS
    src.packed("model.layers.0.mlp.up_proj.weight", shape)  -> PackedLinear | None
    src.tensor("model.norm.weight")                         -> torch tensor (its stored dtype)
    tensor_proto(name, tensor, "f16")                       -> onnx TensorProto (raw data)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from onnx import TensorProto

from arkinfer.errors import NotAvailableError
from arkinfer.lowering.source_weights import SourceWeights

# formats whose tensors an arkinfer-domain function consumes as stored
FUNCTION_FORMATS = ("marlin", "gptq", "awq")


class FolderWeights(SourceWeights):
    """A (quantised or float) Hugging Face folder the ONNX lowering takes: float, or one of
    FUNCTION_FORMATS (NotAvailableError naming the format otherwise)."""

    def __init__(self, folder: str | Path) -> None:
        super().__init__(folder)
        if self.format is not None and self.format not in FUNCTION_FORMATS:
            raise NotAvailableError(
                f"the onnx and tensorrt backends lower marlin, gptq and awq checkpoints, not "
                f"{self.format!r} ({self.ckpt.path})",
                hint="quantise with --quant marlin, gptq or awq (or build float with --quant f16)")


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
