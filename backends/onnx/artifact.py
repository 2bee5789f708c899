"""`lower`: write an ONNX artifact from the traced IR.

    artifact/
      model.onnx, model.onnx.data   the graph (opset 21 + arkinfer-domain functions), weights as
                                    external data
      tokenizer.json, tokenizer_config.json, ...   the runtime tokenizer
      hf/                           the quantised Hugging Face folder the graph was lowered from
                                    (marlin, gptq or awq): verify runs ArkInfer's reference model
                                    on it to check onnxruntime's fidelity on the same weights
      arkinfer.json                 the manifest (written by the pipeline)
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from arkinfer import __version__
from arkinfer.backend import LowerRequest, LowerResult
from arkinfer.lowering.hf_folder import HF_DIR, copy_hf_folder
from arkinfer.lowering.program import program_of
from arkinfer.lowering.tokenizer_files import copy_tokenizer_files, tokenizer_dir
from arkinfer.lowering.versions import version

from . import fn_fused
from .host_graph import ACCURACY_LEVEL_KEY, DEFAULT_MAX_POSITIONS, MAX_POSITIONS_KEY
from .lower_onnx import lower_to_onnx
from .runner import ONNX_FILE
from .weights import FolderWeights

DATA_FILE = "model.onnx.data"


def lower(request: LowerRequest, backend: str = "onnx") -> LowerResult:
    """model.onnx (+ data), the tokenizer and `hf/` into `request.out_dir`; `backend` names the
    backend in the graph's metadata and the notes (tensorrt builds on this)."""
    src = FolderWeights(request.model_dir)
    out = Path(request.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    program = program_of(request, src.raw, entries=("prefill",))  # one graph serves both calls
    recipe = request.recipe.describe() if request.recipe is not None else f"float {request.dtype}"
    target = getattr(request.target, "id", None) or "unknown"
    sparse = program.meta.get("sparse_config")
    meta = {"arkinfer.version": __version__, "arkinfer.model": Path(request.source_dir).name,
            "arkinfer.model_type": str(program.meta["model_type"]),
            "arkinfer.recipe": recipe, "arkinfer.target": target, "arkinfer.backend": backend,
            "arkinfer.sparse_config": json.dumps(sparse),
            "arkinfer.cache_layout": "past.{i}.k/v f32 [1,Hkv,P,D]; past.{i}.fine/coarse f32 "
                                     "[1,Hkv,N,D] (InfLLM v2); outputs present.*",
            MAX_POSITIONS_KEY: str(program.meta.get("max_len", DEFAULT_MAX_POSITIONS))}
    if "accuracy_level" in request.options:  # options.py: the host runner's default from now on
        meta[ACCURACY_LEVEL_KEY] = str(int(request.options["accuracy_level"]))
    request.progress("lowering to ONNX")
    model, layers = lower_to_onnx(program, src, request.dtype, meta)
    request.progress("writing model.onnx + external data")
    onnx.save_model(model, str(out / ONNX_FILE), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=DATA_FILE, size_threshold=1024)
    onnx.checker.check_model(str(out / ONNX_FILE))
    files = [ONNX_FILE, DATA_FILE]
    files += copy_tokenizer_files(tokenizer_dir(request.model_dir, request.source_dir), out)
    notes = []
    if src.format is not None:
        request.progress(f"copying the {src.format} checkpoint to {HF_DIR}/")
        files += copy_hf_folder(request.model_dir, out)
    else:
        notes.append("float build: no hf/ checkpoint copied (the source folder is the float "
                     "checkpoint)")
    linear = {"marlin": "arkinfer.MarlinLinear", "gptq": "arkinfer.Int4Linear (gptq)",
              "awq": "arkinfer.Int4Linear (awq)"}.get(src.format or "", "MatMul (float)")
    fused = {f.name for f in model.functions}
    gqa = fn_fused.ROTARY_GQA in fused
    ops = {"attention": ("InfLLM v2 (arkinfer.InfLLMv2Attention ONNX function; dense below "
                         f"dense_len={sparse.get('dense_len')})") if sparse else
           "dense causal GQA (arkinfer.RotaryGQA; host: com.microsoft.GroupQueryAttention)"
           if gqa else "dense causal GQA (standard ONNX ops)",
           "linear": linear + ("; host: com.microsoft.MatMulNBits" if src.format else ""),
           "rms_norm": "arkinfer.RMSNorm / SkipRMSNorm (host: SimplifiedLayerNormalization / "
                       "com.microsoft.SkipSimplifiedLayerNormalization)",
           "rope": "inside arkinfer.RotaryGQA (cos/sin from positions)" if gqa else
                   "standard ONNX ops (cos/sin from positions)"}
    toolchain = {"onnx": version("onnx") or "unknown",
                 "onnxruntime": version("onnxruntime") or "unknown", "opset": "21 + arkinfer 1"}
    return LowerResult(files=files, ops=ops, toolchain=toolchain, notes=notes, layers=layers)
