"""The `numpy` test backend: one `Capabilities` declaration, a lowering, a runtime.

    artifact/
      weights.npz       every tensor of the reference model, float32 (quantised linears
                        dequantised by their format's numpy unpack)
      config.json       the source's config.json without quantization_config
      tokenizer files   the one list, arkinfer.lowering.tokenizer_files
      hf/               the folder it was lowered from: `reference_weights`, so the pipeline
                        checks this runtime against the reference model on the same weights

Target profile: `numpy-host.toml` beside this file (a profile only narrows what is declared).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from arkinfer.backend import BackendBase, Capabilities, LowerRequest, LowerResult
from arkinfer.frontend.checkpoint import load_model, open_checkpoint
from arkinfer.ir.ops import Op
from arkinfer.lowering.hf_folder import HF_DIR, copy_hf_folder
from arkinfer.lowering.tokenizer_files import copy_tokenizer_files, tokenizer_dir
from arkinfer.lowering.versions import version

NAME = "numpy"
WEIGHTS = "weights.npz"
PROFILE = Path(__file__).with_name("numpy-host.toml")
CAPABILITIES = Capabilities(
    formats=("gptq",), bits=(4,), dtypes=("f32",), cache_dtypes=("f32",),
    # the runner is ArkInfer's reference model, which every IR op is traced from
    ops=tuple(Op),
    attention=("dense", "infllmv2"),  # the reference model runs a config's sparse_config
    packages={"numpy": "writes and reads weights.npz"},
)


class NumpyBackend(BackendBase):
    name = NAME
    capabilities = CAPABILITIES

    def available(self) -> bool:
        return version("numpy") is not None

    def install_hint(self) -> str:
        return "pip install numpy"

    def lower(self, request: LowerRequest) -> LowerResult:
        out = request.out_dir
        model = load_model(open_checkpoint(request.model_dir, with_tokenizer=False))
        request.progress(f"write {WEIGHTS}")
        np.savez(out / WEIGHTS, **{k: v.detach().float().numpy()
                                   for k, v in model.state_dict().items()})
        config = json.loads((request.model_dir / "config.json").read_text(encoding="utf-8"))
        config.pop("quantization_config", None)
        (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        files = [WEIGHTS, "config.json"]
        files += copy_tokenizer_files(tokenizer_dir(request.model_dir, request.source_dir), out)
        files += copy_hf_folder(request.model_dir, out)
        return LowerResult(files=files, ops={"linear": "float32 matmul (torch) over weights.npz"},
                           toolchain={"numpy": version("numpy") or "unknown"})

    def load(self, artifact_dir: str | Path, manifest: dict | None = None, *,
             bench: bool = False):
        from .runner import NumpyRunner

        return NumpyRunner(Path(artifact_dir))

    def reference_weights(self, artifact_dir: str | Path) -> Path:
        return Path(artifact_dir) / HF_DIR


BACKEND = NumpyBackend()
