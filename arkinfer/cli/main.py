"""The `arkinfer` command: one file per verb in this package, registered here.

A verb module exposes either `command` (a function) or `app` (a Typer sub-app for verbs with
sub-commands), plus `HELP` and `EXAMPLES` (real invocations shown in `--help`).
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from arkinfer import __version__
from arkinfer.cli._errors import report_usage_error

try:  # typer >= 0.20 (pinned in constraints.txt) vendors click as typer._click
    from typer._click import exceptions as click_exceptions
except ImportError:  # older typer runs on click itself
    from click import exceptions as click_exceptions

VERBS = ["targets", "inspect", "run", "serve", "eval", "import_", "quantize", "build", "verify",
         "bench", "matrix", "plan", "doctor"]


class ArkGroup(TyperGroup):
    """The root command: click's usage errors (unknown option, missing argument, a value of the
    wrong type) printed as `error: <message>` / `hint: <usage line>; see --help` like every other
    ArkInfer error, with click's exit code 2."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except getattr(click_exceptions, "NoArgsIsHelpError", ()) as exc:
            if exc.format_message().strip():  # bare `arkinfer`: the help (rich already printed it)
                exc.show()
            sys.exit(exc.exit_code)
        except click_exceptions.UsageError as exc:
            ctx = exc.ctx
            report_usage_error(exc.format_message(), ctx.get_usage() if ctx else None,
                               ctx.command_path if ctx else "arkinfer")
            sys.exit(exc.exit_code)
        except click_exceptions.ClickException as exc:
            report_usage_error(exc.format_message(), None, "arkinfer")
            sys.exit(exc.exit_code)
        except typer.Abort:
            print("Aborted!", file=sys.stderr)
            sys.exit(1)
        # without standalone mode click returns the command's result or an Exit's code
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    name="arkinfer",
    cls=ArkGroup,
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
