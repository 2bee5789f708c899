"""`lower`: write the tensorrt artifact — the onnx backend's artifact, gated for the device, with
`hf/` checked against vLLM's loader rules.

    artifact/
      model.onnx, model.onnx.data   the graph (opset 21 + arkinfer-domain functions), weights as
                                    external data
      tokenizer.json, tokenizer_config.json, ...   the runtime tokenizer (host runner, serving)
      hf/                           the quantised Hugging Face folder vLLM / SGLang load (marlin,
                                    gptq or awq; checked here against vLLM's loader rules)
      arkinfer.json                 the manifest (written by the pipeline)

The onnx part is the onnx backend's own lowering, reached through the registry
(`get_backend("onnx").lower_as(request, "tensorrt")`), never by importing backends/onnx here.
"""

from __future__ import annotations

import json
from pathlib import Path

from arkinfer.backend import LowerRequest, LowerResult, get_backend
from arkinfer.errors import ArkError
from arkinfer.lowering.hf_folder import HF_DIR
from arkinfer.lowering.source_weights import SourceWeights

from .preflight import preflight
from .vllm_rules import vllm_problems


def _prepare_for_vllm(dst: Path, fmt: str) -> list[str]:
    """Check the copied quantised folder against vLLM's loader rules; marlin / awq get
    torch_dtype float16 (vLLM runs them in fp16 only: marlin.py / awq.py
    get_supported_act_dtypes), float tensors are cast by vLLM on load."""
    notes = []
    cfg_path = dst / "config.json"
    raw = json.loads(cfg_path.read_text(encoding="utf-8"))
    if fmt in ("marlin", "awq") and raw.get("torch_dtype") != "float16":
        notes.append(f"hf/config.json: torch_dtype {raw.get('torch_dtype')!r} -> 'float16' "
                     f"(vLLM's {fmt} kernels take fp16 activations only)")
        raw["torch_dtype"] = "float16"
        cfg_path.write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    problems = vllm_problems(dst)
    if problems:
        raise ArkError(f"the {fmt} folder would not load in vLLM: " + "; ".join(problems[:5]),
                       hint="re-quantise with the preset for this backend (--quant marlin)")
    return notes


def onnx_artifact(request: LowerRequest) -> LowerResult:
    """The onnx backend's artifact written under this backend's name (the onnx backend from the
    registry: no module here imports backends/onnx)."""
    return get_backend("onnx").lower_as(request, "tensorrt")


def lower(request: LowerRequest) -> LowerResult:
    """The ONNX artifact (the onnx backend's) plus the device gates' notes and an `hf/` folder
    prepared for vLLM."""
    src = SourceWeights(request.model_dir)
    notes = preflight(src.raw, request.recipe, request.target, request.dtype)
    result = onnx_artifact(request)
    hf = Path(request.out_dir) / HF_DIR
    if hf.is_dir():
        notes += _prepare_for_vllm(hf, src.format)
    result.notes = notes + result.notes
    return result
