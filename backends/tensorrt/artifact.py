"""`lower`: write the tensorrt artifact.

    artifact/
      model.onnx, model.onnx.data   the graph (opset 21 + arkinfer-domain functions), weights as
                                    external data
      tokenizer.json, tokenizer_config.json, ...   the runtime tokenizer (host runner, serving)
      hf/                           the quantised Hugging Face folder vLLM / SGLang load (marlin,
                                    gptq or awq; checked against vLLM's loader rules)
      arkinfer.json                 the manifest (written by the pipeline)
"""

from __future__ import annotations

import json
import shutil
from importlib import metadata
from pathlib import Path

import onnx
import torch

from arkinfer import __version__, ir
from arkinfer.backend import LowerRequest, LowerResult
from arkinfer.errors import ArkError

from .lower_onnx import lower_to_onnx
from .preflight import preflight
from .runner import ONNX_FILE
from .vllm_rules import vllm_problems
from .weights import FolderWeights

DATA_FILE = "model.onnx.data"
HF_DIR = "hf"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                   "special_tokens_map.json", "chat_template.jinja")


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "unknown"


def _copy_hf(src: Path, dst: Path, fmt: str) -> list[str]:
    """Copy the quantised folder; marlin / awq get torch_dtype float16 (vLLM runs them in fp16
    only: marlin.py / awq.py get_supported_act_dtypes), float tensors are cast by vLLM on load."""
    shutil.copytree(src, dst)
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


def lower(request: LowerRequest) -> LowerResult:
    src = FolderWeights(request.model_dir)
    notes = preflight(src.raw, request.recipe, request.target, request.dtype)
    out = Path(request.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    program = request.program
    if program is None:
        request.progress("tracing the IR (prefill, symbolic T and P)")
        program = ir.trace(src.raw, dtype=torch.float32, shape_only=True, entries=("prefill",))
    recipe = request.recipe.describe() if request.recipe is not None else f"float {request.dtype}"
    target = getattr(request.target, "id", None) or "unknown"
    sparse = program.meta.get("sparse_config")
    meta = {"arkinfer.version": __version__, "arkinfer.model": Path(request.source_dir).name,
            "arkinfer.model_type": str(program.meta["model_type"]),
            "arkinfer.recipe": recipe, "arkinfer.target": target,
            "arkinfer.sparse_config": json.dumps(sparse),
            "arkinfer.cache_layout": "past.{i}.k/v f32 [1,Hkv,P,D]; past.{i}.fine/coarse f32 "
                                     "[1,Hkv,N,D] (InfLLM v2); outputs present.*"}
    request.progress("lowering to ONNX")
    model, layers = lower_to_onnx(program, src, request.dtype, meta)
    request.progress("writing model.onnx + external data")
    onnx.save_model(model, str(out / ONNX_FILE), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=DATA_FILE, size_threshold=1024)
    onnx.checker.check_model(str(out / ONNX_FILE))
    files = [ONNX_FILE, DATA_FILE]
    tok_dir = request.model_dir if (request.model_dir / "tokenizer.json").is_file() \
        else request.source_dir
    for name in TOKENIZER_FILES:
        if (Path(tok_dir) / name).is_file():
            shutil.copy2(Path(tok_dir) / name, out / name)
            files.append(name)
    if src.format is not None:
        request.progress(f"copying the {src.format} checkpoint to hf/")
        notes += _copy_hf(Path(request.model_dir), out / HF_DIR, src.format)
        files += [f"{HF_DIR}/{p.name}" for p in sorted((out / HF_DIR).iterdir())]
    else:
        notes.append("float build: no hf/ checkpoint copied (serve the source folder with vLLM)")
    linear = {"marlin": "arkinfer.MarlinLinear", "gptq": "arkinfer.Int4Linear (gptq)",
              "awq": "arkinfer.Int4Linear (awq)"}.get(src.format or "", "MatMul (float)")
    ops = {"attention": ("InfLLM v2 (arkinfer.InfLLMv2Attention ONNX function; dense below "
                         f"dense_len={sparse.get('dense_len')})") if sparse else
           "dense causal GQA (standard ONNX ops)",
           "linear": linear + ("; host: com.microsoft.MatMulNBits" if src.format else ""),
           "rms_norm": "standard ONNX ops", "rope": "standard ONNX ops (cos/sin from positions)"}
    toolchain = {"onnx": _version("onnx"), "onnxruntime": _version("onnxruntime"),
                 "opset": "21 + arkinfer 1"}
    return LowerResult(files=files, ops=ops, toolchain=toolchain, notes=notes, layers=layers)
