"""The quantised Hugging Face folder an artifact keeps beside its runtime files, as `hf/`.

    artifact/hf/     config.json (+ quantization_config), model*.safetensors, tokenizer files:
                     the folder the artifact was lowered from (marlin, gptq or awq)

ArkInfer's reference model runs on it (`Backend.reference_weights`) to check the runtime's
fidelity on exactly the weights the artifact holds; serving stacks (vLLM, SGLang) load it as it
is. Backends whose graph is lowered from such a folder (onnx, tensorrt) write and read it here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

HF_DIR = "hf"


def copy_hf_folder(model_dir: str | Path, out_dir: str | Path) -> list[str]:
    """Copy the folder `model_dir` to `out_dir/hf` (which must not exist yet); returns the files
    written as artifact-relative paths (`hf/config.json`, ...), sorted."""
    dst = Path(out_dir) / HF_DIR
    shutil.copytree(model_dir, dst)
    return [f"{HF_DIR}/{p.name}" for p in sorted(dst.iterdir())]
