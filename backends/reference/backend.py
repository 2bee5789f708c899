"""The reference backend (target `host`): the artifact is the Hugging Face folder to run (float or
quantised in the recipe's format) and the Runner is ArkInfer's PyTorch reference model over it, on
this CPU. It is the ground truth other backends are compared with, so it adds nothing of its own:

    artifact/
      model/            config.json (+ quantization_config), *.safetensors, tokenizer files
      arkinfer.json     the manifest (written by the pipeline)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from arkinfer.quant.formats import all_formats

from arkinfer.backend import BackendBase, Capabilities, LowerRequest, LowerResult
from arkinfer.frontend.checkpoint import read_config

MODEL_DIR = "model"
CAPABILITIES = Capabilities(
    # every registered format: `quant.load` unpacks each with its numpy reference (g_idx too)
    formats=tuple(f.name for f in all_formats()), act_order=True,
    # its runtime is the reference model the IR is traced from (it does not read the program),
    # and arkinfer.ir.interpret gives every op its meaning there: every IR op
    ops=("embed", "linear", "rms_norm", "rope", "rope_table", "attention", "add", "mul",
         "mul_scalar", "div_scalar", "silu", "cast", "reshape", "transpose", "concat", "slice"),
)


class ReferenceBackend(BackendBase):
    name = "reference"
    capabilities = CAPABILITIES

    def available(self) -> bool:
        return True

    def install_hint(self) -> str:
        return "always available (part of the core install)"

    def lower(self, request: LowerRequest) -> LowerResult:
        dest = request.out_dir / MODEL_DIR
        dest.mkdir(parents=True)
        files = []
        for f in sorted(request.model_dir.iterdir()):
            if f.is_file():
                request.progress(f"copy {f.name}")
                shutil.copy2(f, dest / f.name)
                files.append(f"{MODEL_DIR}/{f.name}")
        sparse = "sparse_config" in read_config(dest)
        attention = ("InfLLM v2 above dense_len (arkinfer.ops.infllmv2 fast CPU), dense below"
                     if sparse else "dense (arkinfer::attention, torch SDPA)")
        weights = ("dequantised from the packed format by its numpy unpack, fp32 matmul"
                   if request.recipe is not None else "float, fp32 matmul")
        notes = []
        if request.recipe is None and request.dtype != "f32":
            notes.append(f"the reference backend keeps the source checkpoint's dtype and computes "
                         f"in fp32 (asked for {request.dtype})")
        return LowerResult(files=files, ops={"attention": attention, "linear": weights,
                                             "rms_norm": "arkinfer::rms_norm (torch)",
                                             "rope": "arkinfer::rope (torch)"},
                           toolchain={"torch": torch.__version__}, notes=notes)

    def load(self, artifact_dir: str | Path, manifest: dict | None = None, *,
             bench: bool = False):
        from arkinfer.pipeline.reference_runner import ReferenceRunner

        return ReferenceRunner(Path(artifact_dir) / MODEL_DIR)

    # reference_weights: None (the default): this runtime *is* the reference model, so there is
    # no separate runtime-fidelity check to make.


BACKEND = ReferenceBackend()
