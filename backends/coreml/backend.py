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

from arkinfer.backend import BackendBase, Capabilities, LowerRequest, LowerResult

from .options import OPTIONS, context_option

CAPABILITIES = Capabilities(
    # formats whose canonical weights `constexpr_blockwise_shift_scale` holds exactly: integer
    # zero points, static groups (no act-order), fp16 scales, 4- or 8-bit codes
    formats=("gptq", "awq", "marlin", "gguf-q4_0"), bits=(4, 8),
    # program.CONVERSIONS' keys (a test keeps them equal); rope_table is not converted: the
    # cos / sin tables are computed from positions in fp32, not held as a [max_len, D] constant
    ops=("embed", "linear", "rms_norm", "rope", "attention", "add", "mul", "mul_scalar",
         "div_scalar", "silu", "cast", "reshape", "transpose", "concat", "slice"),
    cache_dtypes=("f16",),  # the KV cache is Core ML state, fp16
    extra="coreml", packages={"coremltools": ""},
)

class CoreMLBackend(BackendBase):
    name = "coreml"
    capabilities = CAPABILITIES
    options = OPTIONS

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
        check_recipe(recipe, self.capabilities)
        check_ops(raw_config)
        return ["coreml: runtime parity is deferred to macOS (Core ML prediction is macOS-only)"]

    def check_options(self, options: dict[str, str]) -> None:
        """`context=` at plan time (its upper bound, the model's positions, at lower)."""
        context_option(options.get("context"), None)

    def lower(self, request: LowerRequest) -> LowerResult:
        from .artifact import lower

        return lower(request)

    def load(self, artifact_dir: str | Path, manifest: dict | None = None, *,
             bench: bool = False):
        from .runner import CoreMLRunner

        return CoreMLRunner(artifact_dir)


BACKEND = CoreMLBackend()
