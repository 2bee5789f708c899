"""The tensorrt backend (NVIDIA Jetson / CUDA): the onnx backend's artifact (ONNX graph with
arkinfer-domain functions, run on the host by onnxruntime) extended by the device's gates
(CUDA capability, FP8), the quantised HF checkpoint prepared for vLLM, and the CUDA kernels in
`kernels/`. Files and ops: README.md.

    BACKEND.preflight(raw_config, recipe, target, dtype) -> notes (TargetError when impossible)
    BACKEND.lower(LowerRequest)                          -> LowerResult (artifact.py)
    BACKEND.load(artifact_dir, manifest)                 -> OnnxRunner (the onnx backend's)

The onnx part is composed, not inherited: the onnx backend is looked up in the registry when it
is needed (`get_backend("onnx")`), so no module here imports backends/onnx.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arkinfer.backend import (
    BackendBase,
    Capabilities,
    LowerRequest,
    LowerResult,
    get_backend,
)


def onnx_backend():
    """The onnx backend this one builds on, from the registry."""
    return get_backend("onnx")


class TensorRTBackend(BackendBase):
    name = "tensorrt"

    @property
    def options(self):
        """The onnx lowering's `--option`s (its host runner's accuracy level)."""
        return onnx_backend().options

    @property
    def capabilities(self) -> Capabilities:
        """The onnx lowering's: the same graph, formats and host runner; the device gates (CUDA
        capability, FP8) are the target's, checked in preflight.py."""
        return onnx_backend().capabilities

    def available(self) -> bool:
        """The onnx backend's packages (onnx + onnxruntime): TensorRT itself runs on the device."""
        return onnx_backend().available()

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

    def load(self, artifact_dir: str | Path, manifest: dict | None = None, *,
             bench: bool = False, ops: str | None = None, threads: int | None = None,
             accuracy_level: int | None = None):
        """The onnx backend's OnnxRunner over artifact/model.onnx (its `load` explains `ops`)."""
        return onnx_backend().load(artifact_dir, manifest, bench=bench, ops=ops, threads=threads,
                                   accuracy_level=accuracy_level)

    def reference_weights(self, artifact_dir: str | Path) -> Path | None:
        """The onnx backend's: the `hf/` checkpoint the graph was lowered from."""
        return onnx_backend().reference_weights(artifact_dir)


BACKEND = TensorRTBackend()
