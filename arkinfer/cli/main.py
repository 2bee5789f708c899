"""The `arkinfer` command: one file per verb in this package, registered here.

A verb module exposes either `command` (a function) or `app` (a Typer sub-app for verbs with
sub-commands), plus `HELP` and `EXAMPLES` (real invocations shown in `--help`).
"""

from __future__ import annotations

import importlib
from typing import Annotated

import typer

from arkinfer import __version__

VERBS = ["targets", "inspect", "run", "eval", "import_", "quantize", "build", "verify", "bench",
         "plan", "doctor"]

app = typer.Typer(
    name="arkinfer",
    help="Compile small LLMs (MiniCPM4 with InfLLM v2, Llama family) into verified edge artifacts.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
)


def _version_callback(value: bool) -> None:
    if value:
        print(f"arkinfer {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """ArkInfer: MiniCPM4 / Llama checkpoints to verified, benchmarked edge artifacts."""


def _help_with_examples(module) -> str:
    examples = "\n\n".join(f"    {e}" for e in getattr(module, "EXAMPLES", []))
    text = module.HELP
    if examples:
        text += "\n\n**Examples**\n\n" + examples
    return text


def _register() -> None:
    for verb in VERBS:
        module = importlib.import_module(f"arkinfer.cli.{verb}")
        name = verb.rstrip("_")
        if hasattr(module, "app"):
            module.app.info.help = _help_with_examples(module)
            app.add_typer(module.app, name=name)
        else:
            app.command(name=name, help=_help_with_examples(module))(module.command)


_register()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
