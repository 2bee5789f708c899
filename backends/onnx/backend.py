"""The onnx backend: one ONNX graph lowered from the IR, with the quantised linears and InfLLM v2
as `arkinfer`-domain functions whose bodies are standard ops, so any ONNX runtime runs it
(ONNX Runtime on a host CPU, Android, Windows or the web). Host runner: onnxruntime. Files and
ops: README.md. The tensorrt backend builds on this one (through the registry: `lower_as`).

    BACKEND.preflight(raw_config, recipe, target, dtype) -> notes (TargetError when impossible)
    BACKEND.lower(LowerRequest)                          -> LowerResult (artifact.py)
    BACKEND.lower_as(LowerRequest, backend)              -> the same, named for `backend`
    BACKEND.load(artifact_dir, manifest)                 -> OnnxRunner (runner.py)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from arkinfer.backend import BackendBase, Capabilities, LowerRequest, LowerResult

from .options import OPTIONS

CAPABILITIES = Capabilities(
    # quantised linears are arkinfer.MarlinLinear / arkinfer.Int4Linear functions: 4-bit codes
    # with a g_idx input (act-order runs through the function body; MatMulNBits has no g_idx)
    formats=("marlin", "gptq", "awq"), bits=(4,), act_order=True,
    # the ops lower_onnx emits node by node; rope_table (the fold_rope_tables pass) is not
    # one: rope runs from positions (arkinfer.RotaryGQA / com.microsoft.GroupQueryAttention)
    ops=("embed", "linear", "rms_norm", "rope", "attention", "add", "mul", "mul_scalar",
         "div_scalar", "silu", "cast", "reshape", "transpose", "concat", "slice"),
    extra="onnx", packages={"onnx": "graph", "onnxruntime": "host runner"},
)


class OnnxBackend(BackendBase):
    name = "onnx"
    capabilities = CAPABILITIES
    options = OPTIONS

    def available(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))

    def install_hint(self) -> str:
        return "pip install 'arkinfer[onnx]'  (onnx + onnxruntime)"

    def preflight(self, raw_config: dict, recipe: Any, target: Any,
                  dtype: str = "f32") -> list[str]:
        """Raise TargetError when the ONNX lowering cannot take this model or recipe (formats,
        bits, shape rules, use_nope); no notes otherwise. Reads config.json only."""
        from .preflight import preflight

        return preflight(raw_config, recipe, target, self.name, self.capabilities)

    def lower(self, request: LowerRequest) -> LowerResult:
        return self.lower_as(request, self.name)

    def lower_as(self, request: LowerRequest, backend: str) -> LowerResult:
        """This backend's artifact with `backend` named in the graph's metadata and the notes: how
        a backend built on this one (tensorrt, through `get_backend("onnx")`) writes its graph."""
        from .artifact import lower

        return lower(request, backend)

    def load(self, artifact_dir: str | Path, manifest: dict | None = None, *,
             bench: bool = False, ops: str | None = None, threads: int | None = None,
             accuracy_level: int | None = None):
        """OnnxRunner over artifact/model.onnx; ops "contrib" (MatMulNBits + fused contrib ops,
        default), "nbits" (MatMulNBits only) or "function" (every arkinfer node through its ONNX
        body); accuracy_level: MatMulNBits' activations (default: the level the artifact was
        built with, `--option accuracy_level`, else 0)."""
        from .runner import OnnxRunner

        return OnnxRunner(artifact_dir, ops=ops or "contrib", threads=threads,
                          accuracy_level=accuracy_level)

    def reference_weights(self, artifact_dir: str | Path) -> Path | None:
        """The `hf/` checkpoint (Marlin / GPTQ / AWQ) the ONNX graph was lowered from: the
        pipeline runs ArkInfer's reference model on it to check onnxruntime's fidelity."""
        hf = Path(artifact_dir) / "hf"
        return hf if (hf / "config.json").is_file() else None


BACKEND = OnnxBackend()
