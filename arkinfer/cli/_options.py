"""Option aliases shared by every command so each option is spelled the same everywhere."""

from __future__ import annotations

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
