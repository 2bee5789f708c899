"""The coreml backend (iPhone / Neural Engine): one iOS 18 ML program (`model.mlpackage`) with
`prefill` and `decode` functions sharing their weights, the KV cache as Core ML state, fp16
compute, quantised linears as `constexpr_blockwise_shift_scale` holding the recipe's canonical
codes, ArkInfer's custom ops (rms_norm, rope, attention, InfLLM v2) as compositions of MIL ops.
Files, options and limits: README.md.

    BACKEND.preflight(raw_config, recipe, target, dtype) -> notes (TargetError when impossible)
    BACKEND.lower(LowerRequest)                          -> LowerResult (artifact.py)
    BACKEND.load(artifact_dir, manifest)                 -> CoreMLRunner (runner.py): Core ML on
        macOS; elsewhere the saved program under coremltools' op definitions, with runtime
        parity deferred to macOS (the manifest and `arkinfer verify` say so)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from arkinfer.backend import BackendBase, LowerRequest, LowerResult


class CoreMLBackend(BackendBase):
    name = "coreml"

    def available(self) -> bool:
        return importlib.util.find_spec("coremltools") is not None

    def install_hint(self) -> str:
        return "pip install 'arkinfer[coreml]'  (coremltools; Core ML itself runs on macOS / iOS)"

    def preflight(self, raw_config: dict, recipe: Any, target: Any,
                  dtype: str = "f16") -> list[str]:
        """Raise TargetError when the Core ML lowering cannot take this model or recipe (format,
        bits, act-order, an IR op without a conversion); reads config.json only."""
        from .preflight import check_ops, check_recipe

        if target is not None:
            target.check(self.name, recipe.format if recipe is not None else None,
                         dtype if recipe is None else None)
        check_recipe(recipe)
        check_ops(raw_config)
        return ["coreml: runtime parity is deferred to macOS (Core ML prediction is macOS-only)"]

    def lower(self, request: LowerRequest) -> LowerResult:
        from .artifact import lower

        return lower(request)

    def load(self, artifact_dir: str | Path, manifest: dict | None = None, *,
             bench: bool = False):
        from .runner import CoreMLRunner

        return CoreMLRunner(artifact_dir)


BACKEND = CoreMLBackend()
