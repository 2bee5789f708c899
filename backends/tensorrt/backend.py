"""The tensorrt backend object (NVIDIA Jetson / CUDA): ONNX graph + Marlin checkpoint; host runner
onnxruntime."""

from __future__ import annotations

import importlib.util


class TensorRTBackend:
    name = "tensorrt"

    def available(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))

    def install_hint(self) -> str:
        return "pip install 'arkinfer[onnx]'  (onnx + onnxruntime; TensorRT itself runs on the device)"


BACKEND = TensorRTBackend()
