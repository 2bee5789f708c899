"""A Core ML artifact on this machine (`arkinfer.backend.Runner`).

    runner = CoreMLRunner(artifact_dir)          # macOS: Core ML; elsewhere: the MIL evaluator
    logits = runner.window_logits(ids)           # [T, V] float32 from an empty cache
    runner.reset(); runner.prefill(ids[:-1]); nxt = runner.decode(ids[-1])

On macOS (`sys.platform == "darwin"`) the package runs in Core ML itself: `MLModel(...,
function_name="prefill" | "decode")`, one `make_state()` shared by both functions. Everywhere
else Core ML's runtime does not exist (coremltools' `predict` is macOS-only), so the runner
evaluates the *saved* package's MIL program with coremltools' op definitions (evaluate.py) and
says so: `runtime` names what ran and `deferred` (the Runner contract's, which verify records)
lists the checks left for macOS.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from arkinfer.backend import StepRunner
from arkinfer.errors import NotAvailableError
from arkinfer.frontend.tokenizer import load_tokenizer

PACKAGE = "model.mlpackage"
ENTRIES = ("prefill", "decode")
DEFERRED = ("runtime parity: deferred to macOS (Core ML prediction is macOS-only; on this "
            "machine the saved package's MIL program ran under coremltools' op definitions, "
            "not Core ML's CPU / GPU / Neural Engine kernels)")


def on_macos() -> bool:
    return sys.platform == "darwin"


class CoreMLRunner(StepRunner):
    def __init__(self, artifact_dir: str | Path, *, context: int | None = None) -> None:
        self.dir = Path(artifact_dir)
        self.package = self.dir / PACKAGE
        if not self.package.is_dir():
            raise NotAvailableError(f"{self.package} does not exist",
                                    hint="build the artifact with arkinfer build --backend coreml")
        self.tokenizer = load_tokenizer(self.dir)
        if on_macos():
            self._open_coreml()
            self.runtime = "Core ML (MLModel.predict, macOS)"
            self.deferred = ()  # Core ML itself ran: nothing left for another machine
        else:
            self._open_evaluator()
            self.runtime = "MIL evaluator (coremltools value inference of the saved package)"
            self.deferred = (DEFERRED,)
        self.reset()

    # ------------------------------------------------------------------ back ends
    def _open_coreml(self) -> None:
        import coremltools as ct

        self.models = {e: ct.models.MLModel(str(self.package), function_name=e)
                       for e in ENTRIES}
        spec = self.models["decode"].get_spec()
        self.context = int(spec.description.state[0].type.stateType.arrayType.shape[2])
        self.vocab_size = int(spec.description.output[0].type.multiArrayType.shape[-1])

    def _open_evaluator(self) -> None:
        from .evaluate import MilEvaluator, load_functions

        fns = load_functions(self.package)
        missing = [e for e in ENTRIES if e not in fns]
        if missing:
            raise NotAvailableError(f"{self.package} has no function(s) {missing}",
                                    hint="rebuild the artifact with arkinfer build --backend coreml")
        self.evaluators = {e: MilEvaluator(fns[e]) for e in ENTRIES}
        decode = fns["decode"]
        self.context = int(decode.inputs["k_cache_0"].shape[2])
        self.vocab_size = int(decode.outputs[0].shape[-1])

    # ------------------------------------------------------------------ Runner
    def reset(self) -> None:
        self.pos = 0
        if on_macos():
            self.state = self.models["decode"].make_state()
        else:
            states = self.evaluators["decode"].states
            for arr in states.values():
                arr[...] = 0
            self.evaluators["prefill"].states = states  # one cache, two functions

    def _step(self, ids: list[int], last_only: bool = False) -> torch.Tensor:
        if self.pos + len(ids) > self.context:
            raise NotAvailableError(f"{self.pos} cached + {len(ids)} new tokens exceed the "
                                    f"package's context of {self.context} tokens",
                                    hint="rebuild with --option context=N (a multiple of 64)")
        entry = "decode" if len(ids) == 1 else "prefill"
        feeds = {"tokens": np.asarray([ids], np.int32),
                 "start": np.asarray([self.pos], np.int32)}
        if on_macos():
            out = self.models[entry].predict(feeds, state=self.state)["logits"]
        else:
            out = self.evaluators[entry].run(feeds)["logits"]
        self.pos += len(ids)
        return torch.from_numpy(np.asarray(out, np.float32)[0])
