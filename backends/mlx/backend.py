"""The mlx backend (Apple silicon): weights in mlx-lm's layout, which unmodified mlx-lm loads,
run on this machine by ArkInfer's MLX runtime (`mlx[cpu]` on Linux, Metal on a Mac). Files,
key map and what is untested without Metal: README.md.

    BACKEND.preflight(raw_config, recipe, target, dtype) -> notes (TargetError when impossible)
    BACKEND.lower(LowerRequest)                          -> LowerResult (artifact.py)
    BACKEND.load(artifact_dir, manifest)                 -> Runner (runner.load_runner)
    BACKEND.reference_weights(artifact_dir)              -> the artifact's weights as a float
                                                            HF folder (reference.py)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from arkinfer.backend import BackendBase, Capabilities, LowerRequest, LowerResult

from .options import OPTIONS, shard_bytes

CAPABILITIES = Capabilities(
    # mlx stored as it is; gptq / awq codes repacked to MLX affine, exactly. Bits and group sizes
    # are MLX affine's (the `mlx` format's constraints); MLX groups consecutive columns, so no
    # act-order.
    formats=("mlx", "gptq", "awq"),
    # the artifact is weights + config, not the IR (lowers_from_ir = False): model.py runs every
    # op the architectures preflight accepts trace to (every IR op but rope_table, which only
    # the fold_rope_tables pass makes)
    ops=("embed", "linear", "rms_norm", "rope", "attention", "add", "mul", "mul_scalar",
         "div_scalar", "silu", "cast", "reshape", "transpose", "concat", "slice"),
    cache_dtypes=("f32", "f16", "bf16"),  # the KV cache is kept in the weights' float dtype
    extra="mlx", packages={"mlx": ""},
)


class MLXBackend(BackendBase):
    name = "mlx"
    capabilities = CAPABILITIES
    lowers_from_ir = False  # the artifact is weights + config: build skips the trace
    options = OPTIONS

    def available(self) -> bool:
        """mlx importable (lowering needs mx.quantize / mx.save_safetensors, the runner MLX);
        mlx-lm is needed only to check the artifact in its consumer (tests)."""
        return importlib.util.find_spec("mlx") is not None

    def install_hint(self) -> str:
        return "pip install 'arkinfer[mlx]'  (mlx[cpu] on Linux, mlx with Metal on macOS; mlx-lm)"

    def preflight(self, raw_config: dict, recipe: Any, target: Any,
                  dtype: str = "f32") -> list[str]:
        """Raise TargetError when the MLX artifact cannot be built (architecture, format, bits,
        group size, a layer whose width the group size does not divide); else notes on what
        mlx-lm does differently with this model. Reads config.json only."""
        from .preflight import preflight

        return preflight(raw_config, recipe, target, dtype)

    def check_options(self, options: dict[str, str]) -> None:
        """shard_mb at plan time (rtn and scales are checked as declared choices)."""
        shard_bytes(options)

    def quantizes_in_lower(self, recipe: Any, options: dict[str, str]) -> bool:
        """RTN in the mlx format with rtn=mlx (mlx4, mlx8 by default): `mx.quantize` rounds the
        float source in lower, the bytes `mlx_lm.convert -q` writes; no quantised folder."""
        from .tensors import mx_rtn

        return mx_rtn(recipe, options)

    def lower(self, request: LowerRequest) -> LowerResult:
        from .artifact import lower

        return lower(request)

    def load(self, artifact_dir: str | Path, manifest: dict | None = None, *,
             bench: bool = False):
        """ArkInfer's MLX runtime over the artifact (backends/mlx/runner.py)."""
        from .runner import load_runner

        return load_runner(Path(artifact_dir), manifest or {}, bench=bench)

    def reference_weights(self, artifact_dir: str | Path) -> Path:
        """The artifact's exact weights as a float folder ArkInfer's reference model runs
        (quantised: dequantised by MLX's formula into the cache; float: the artifact itself)."""
        from .reference import reference_folder

        return reference_folder(artifact_dir)


BACKEND = MLXBackend()
