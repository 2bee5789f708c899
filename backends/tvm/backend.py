"""The tvm backend (Android GPUs through OpenCL): ArkInfer's IR lowered to one Relax/TIR module,
compiled for this machine (llvm: the Runner) and for the phone (OpenCL on Adreno / Mali with an
aarch64 Android host). Files, layout and what is verified where: README.md.

    BACKEND.preflight(raw_config, recipe, target, dtype) -> notes (TargetError when impossible)
    BACKEND.lower(LowerRequest)                          -> LowerResult (artifact.py)
    BACKEND.load(artifact_dir, manifest)                 -> TVMRunner (runner.py)
    BACKEND.reference_weights(artifact_dir)              -> the artifact's weights as a float
                                                            HF folder (reference.py)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from arkinfer.backend import BackendBase, Capabilities, LowerRequest, LowerResult

from .options import OPTIONS

CAPABILITIES = Capabilities(
    # the int4 kernel (kernels_linear.linear_q4) reads uniform 4-bit codes with static groups,
    # repacked losslessly from any of these formats' canonical weights (weights.py)
    formats=("gguf-q4_0", "gguf-q4_1", "ort", "onnx-qdq", "gptq", "awq", "marlin", "mlx"),
    bits=(4,),
    # lower_relax.LOWERINGS' keys (a test keeps them equal): every IR op, rope_table included
    # (its ir_passes fold RoPE into a cos|sin table)
    ops=("embed", "linear", "rms_norm", "rope", "rope_table", "attention", "add", "mul",
         "mul_scalar", "div_scalar", "silu", "cast", "reshape", "transpose", "concat", "slice"),
    extra="tvm", packages={"apache-tvm": ""},
    remote_bench=True,  # `bench --rpc`: TVM RPC (rpc_bench.py)
)


class TVMBackend(BackendBase):
    name = "tvm"
    capabilities = CAPABILITIES
    # RoPE as a position-indexed cos|sin table (a gather per call, like MLC-LLM); q/k/v and
    # gate/up stay separate linears: the quantised checkpoint stores them separately.
    ir_passes = ("fold_rope_tables", "dce")
    options = OPTIONS

    def available(self) -> bool:
        return importlib.util.find_spec("tvm") is not None

    def install_hint(self) -> str:
        return "pip install 'arkinfer[tvm]'  (apache-tvm)"

    def preflight(self, raw_config: dict, recipe: Any, target: Any,
                  dtype: str = "f32") -> list[str]:
        """Raise TargetError when the module cannot be built (recipe, group sizes, an IR op
        without a TVM lowering); else notes. Reads config.json only."""
        from .preflight import preflight

        return preflight(raw_config, recipe, target, dtype, self.ir_passes, self.capabilities)

    def check_options(self, options: dict[str, str]) -> None:
        """`devices=` at plan time (the other keys are declared choices)."""
        from .artifact import device_variants

        device_variants(options)

    def lower(self, request: LowerRequest) -> LowerResult:
        from .artifact import lower

        return lower(request, self.ir_passes)

    def load(self, artifact_dir: str | Path, manifest: dict | None = None, *,
             bench: bool = False):
        from .runner import TVMRunner

        return TVMRunner(artifact_dir)

    def reference_weights(self, artifact_dir: str | Path) -> Path:
        from .reference import reference_folder

        return reference_folder(artifact_dir)

    def bench_remote(self, artifact_dir: str | Path, manifest: dict, address: str,
                     key: str | None, spec: Any, progress=None) -> list[dict]:
        """`bench --rpc`: the artifact timed on a TVM RPC server (or a tracker's device for
        `key`) with TVM's time_evaluator; see rpc_bench.py."""
        from .rpc_bench import bench_remote

        return bench_remote(artifact_dir, manifest, address, key, spec, progress=progress)


BACKEND = TVMBackend()
