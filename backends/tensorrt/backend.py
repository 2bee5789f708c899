"""The tensorrt backend object (NVIDIA Jetson / CUDA): ONNX graph with arkinfer-domain functions +
the quantised HF checkpoint vLLM loads; host runner onnxruntime. Files and ops: README.md.

    BACKEND.preflight(raw_config, recipe, target)  -> notes (TargetError when impossible)
    BACKEND.lower(LowerRequest)                     -> LowerResult (artifact.py)
    BACKEND.load(artifact_dir, manifest)            -> OnnxRunner (runner.py)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from arkinfer.backend import BackendBase, LowerRequest, LowerResult


class TensorRTBackend(BackendBase):
    name = "tensorrt"

    def available(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))

    def install_hint(self) -> str:
        return "pip install 'arkinfer[onnx]'  (onnx + onnxruntime; TensorRT itself runs on the device)"

    def preflight(self, raw_config: dict, recipe: Any, target: Any,
                  dtype: str = "f32") -> list[str]:
        """Raise arkinfer.errors.TargetError when this build cannot work (Marlin shape rules
        naming the layer, sm_87 gates); otherwise the notes to report. Reads config.json only."""
        from .preflight import preflight

        return preflight(raw_config, recipe, target, dtype)

    def lower(self, request: LowerRequest) -> LowerResult:
        from .artifact import lower

        return lower(request)

    def load(self, artifact_dir: str | Path, manifest: dict | None = None, *,
             bench: bool = False, ops: str | None = None, threads: int | None = None):
        """OnnxRunner over artifact/model.onnx; ops "contrib" (MatMulNBits, default) or
        "function" (every arkinfer node through its ONNX body); manifest `runner.ops` overrides
        the default."""
        from .runner import OnnxRunner

        runner_cfg = (manifest or {}).get("runner") or {}
        return OnnxRunner(artifact_dir, ops=ops or runner_cfg.get("ops", "contrib"),
                          threads=threads)

    def reference_weights(self, artifact_dir: str | Path) -> Path | None:
        """The `hf/` checkpoint (Marlin / GPTQ / AWQ) the ONNX graph was lowered from: the
        pipeline runs ArkInfer's reference model on it to check onnxruntime's fidelity."""
        hf = Path(artifact_dir) / "hf"
        return hf if (hf / "config.json").is_file() else None


BACKEND = TensorRTBackend()
