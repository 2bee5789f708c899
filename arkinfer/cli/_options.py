"""Option aliases shared by every command so each option is spelled the same everywhere.

Short flags mean one thing in every command: `-t` target, `-q` quant, `-b` backend, `-o` the
folder (or file) a command writes, `-p` prompt(s), `-n` tokens to generate. `bench` spelled its
output format `-o` and its threads `-t` before; those spellings still work for one release and
print a deprecation line (`deprecated_alias`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

ModelArg = Annotated[
    str,
    typer.Argument(help="A Hugging Face model folder, a .gguf file (imported once into the cache) "
                   "or 'demo' (the embedded demo model, the default)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
TargetOpt = Annotated[str, typer.Option("--target", "-t", help="Target id, alias or a .toml "
                                        "profile (`arkinfer targets`).")]
QuantOpt = Annotated[str, typer.Option(
    "--quant", "-q", help="f32, f16 (fp16), bf16, int4 (the backend's 4-bit preset) or a preset: "
    "q4_0, q4_1, q8_0, gptq, awq, marlin, ternary, mlx4, ort4.")]
BackendOpt = Annotated[str | None, typer.Option("--backend", "-b", help="Backend (default: the "
                                                "target's, or the first of its backends that "
                                                "takes --quant).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing output of the same "
                                        "kind (never a folder ArkInfer did not write).")]


def deprecated_alias(old: str, new: str) -> None:
    """Print the one-release deprecation line for an old option spelling (stderr)."""
    from arkinfer.cli._output import err_console

    err_console.print(f"deprecated: {old} is now {new}; the old spelling goes away in the next "
                      "release", markup=False)
DenseOpt = Annotated[
    bool,
    typer.Option("--dense", help="Run dense attention even when the config has a sparse_config."),
]
class InfLLMv2Impl(StrEnum):
    fast = "fast"
    reference = "reference"


SparseImplOpt = Annotated[
    InfLLMv2Impl,
    typer.Option("--infllmv2", help="InfLLM v2 implementation for sparse-config models: the fast "
                 "CPU path or the literal reference (slow; for checking)."),
]
