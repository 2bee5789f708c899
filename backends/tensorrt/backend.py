"""The tensorrt backend (NVIDIA Jetson / CUDA): the onnx backend's artifact (ONNX graph with
arkinfer-domain functions, run on the host by onnxruntime) extended by the device's gates
(CUDA capability, FP8), the quantised HF checkpoint prepared for vLLM, and the CUDA kernels in
`kernels/`. Files and ops: README.md.

    BACKEND.preflight(raw_config, recipe, target, dtype) -> notes (TargetError when impossible)
    BACKEND.lower(LowerRequest)                          -> LowerResult (artifact.py)
    BACKEND.load(artifact_dir, manifest)                 -> OnnxRunner (the onnx backend's)
"""

from __future__ import annotations

from typing import Any

from arkinfer.backend import LowerRequest, LowerResult
from arkinfer.backends.onnx.backend import OnnxBackend


class TensorRTBackend(OnnxBackend):
    name = "tensorrt"
    # the onnx lowering's: the same graph, formats and host runner; the device gates (CUDA
    # capability, FP8) are the target's, checked in preflight.py
    capabilities = OnnxBackend.capabilities

    def install_hint(self) -> str:
        return "pip install 'arkinfer[onnx]'  (onnx + onnxruntime; TensorRT itself runs on the device)"

    def preflight(self, raw_config: dict, recipe: Any, target: Any,
                  dtype: str = "f32") -> list[str]:
        """Raise arkinfer.errors.TargetError when this build cannot work (the onnx lowering's
        rules, sm_80 / sm_89 gates); otherwise the notes to report. Reads config.json only."""
        from .preflight import preflight

        return preflight(raw_config, recipe, target, dtype)

    def lower(self, request: LowerRequest) -> LowerResult:
        from .artifact import lower

        return lower(request)


BACKEND = TensorRTBackend()
