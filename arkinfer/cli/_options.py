"""Option aliases shared by every command so each option is spelled the same everywhere."""

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
