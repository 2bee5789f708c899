"""The Runner of a TVM artifact on this machine: its host (llvm) library through `TVMSession`.

    runner = TVMRunner(artifact_dir)          # host/model.so + params.safetensors
    runner.prefill(ids); runner.decode(tok)   # torch float32 logits, as the Runner contract says

verify, eval and bench use it; the device builds (device/*.tar) run only on a phone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from arkinfer.backend import StepRunner
from arkinfer.errors import ArkError
from arkinfer.frontend.tokenizer import load_tokenizer

from .artifact import MODULE_FILE
from .lower_relax import Signature
from .session import TVMSession


def read_module_info(artifact_dir: Path) -> dict:
    path = Path(artifact_dir) / MODULE_FILE
    if not path.is_file():
        raise ArkError(f"{artifact_dir} has no {MODULE_FILE}; it is not a tvm artifact",
                       hint="build one with `arkinfer build MODEL --target android`")
    return json.loads(path.read_text(encoding="utf-8"))


def load_params(artifact_dir: Path, info: dict) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(Path(artifact_dir) / info["params_file"]))


def use_torch_threads() -> int:
    """TVM's thread pool size for this process: TVM_NUM_THREADS when the user set it, else
    torch's thread count (what ArkInfer's other runtimes and the llama.cpp comparisons use).
    Without it TVM halves the core count on x86 (it assumes hyper-threading), which on this
    2-core machine ran every parallel loop on one thread (decode 56 ms -> 32 ms per step).
    Must run before the first parallel kernel: the pool reads the variable once."""
    os.environ.setdefault("TVM_NUM_THREADS", str(torch.get_num_threads()))
    return int(os.environ["TVM_NUM_THREADS"])


class TVMRunner(StepRunner):
    def __init__(self, artifact_dir: str | Path) -> None:
        import tvm

        self.threads = use_torch_threads()
        self.dir = Path(artifact_dir)
        info = read_module_info(self.dir)
        lib = tvm.runtime.load_module(str(self.dir / info["host"]["library"]))
        self.session = TVMSession(lib, tvm.cpu(), load_params(self.dir, info),
                                  Signature.from_json(info))
        self.vocab_size = self.session.vocab_size
        # A sparse_config model runs InfLLM v2 past dense_len inside the module (lowered), like
        # the reference model: no fixed attention mode.
        self.fixed_attention = None
        self.tokenizer = load_tokenizer(self.dir)

    def reset(self) -> None:
        self.session.reset()

    def _step(self, ids: list[int], last_only: bool) -> torch.Tensor:
        return torch.from_numpy(self.session.step(ids).copy())
