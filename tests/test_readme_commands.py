"""Every command the README shows is one that works, and every page it points at exists.

Each shell command in README.md's ```bash / ```sh / ```console blocks is checked by kind:
- `make X`: X is a target of the Makefile;
- `arkinfer ...`: the CLI's own parser (click, under Typer) accepts the arguments, parsed without
  running the command;
- `python benchmarks/X.py ...`: the script exists and every `--flag` appears in its `--help`;
- `pip install ...`: every extra named is one pyproject.toml declares, and a pinned version equals
  constraints.txt's.
Any other kind of command fails the test: add a check here before showing it in the README.

The quick start's `make demo` commands are the Makefile's `demo` recipe (checked here), and they
run end to end in `test_make_demo_commands_run`. The same steps are also exercised one by one
elsewhere: `build demo --quant q4_0` on host's gguf backend through the CLI in
tests/quant_calib/test_weight_only.py, build -> verify -> load -> eval -> bench of the demo on
every backend in tests/backends/e2e/test_backends_e2e.py, `bench` through the CLI in
tests/pipeline/test_pipeline_bench_eval.py, `run demo` through the CLI in
tests/safety/test_run_prompt.py and the demo's answer to the quick start's question in
tests/frontend/test_demo_model.py; tests/test_workflows.py holds CI to `make test`.

Links: every relative link in README.md, BENCHMARKS.md and docs/*.md points at a file, and every
page in docs/ is reachable from the README.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_README_LINES = 260
FENCE = re.compile(r"^```(\w*)\s*$")
SHELL_LANGS = {"bash", "sh", "console"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def code_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of every fenced block, in order."""
    blocks, lang, lines = [], None, []
    for line in text.splitlines():
        fence = FENCE.match(line.strip())
        if fence and lang is None:
            lang, lines = fence.group(1), []
        elif line.strip() == "```" and lang is not None:
            blocks.append((lang, lines))
            lang = None
        elif lang is not None:
            lines.append(line)
    return blocks


def shell_commands(text: str) -> list[list[str]]:
    """Every command of the shell blocks as argv: continuation lines joined, comments and
    leading VAR=value assignments dropped, `a && b` split; in console blocks only `$ ` lines."""
    commands = []
    for lang, lines in code_blocks(text):
        if lang not in SHELL_LANGS:
            continue
        if lang == "console":
            lines = [line[2:] for line in lines if line.startswith("$ ")]
        joined = "\n".join(lines).replace("\\\n", " ")
        for line in joined.splitlines():
            for part in line.split(" && "):
                argv = shlex.split(part, comments=True)
                while argv and ENV_ASSIGNMENT.match(argv[0]):
                    argv = argv[1:]
                if argv:
                    commands.append(argv)
    return commands


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z0-9_.-]+):(?!=)", text, flags=re.MULTILINE))


def demo_recipe() -> list[list[str]]:
    """The Makefile's `demo` recipe as arkinfer argv lists ($(ARK) is the venv's arkinfer)."""
    lines = (REPO / "Makefile").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("demo:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(shlex.split(line.strip().replace("$(ARK)", "arkinfer")))
    return recipe


def parse_arkinfer(args: list[str]) -> None:
    """Parse `arkinfer ARGS` with the CLI's own click commands, without invoking anything: an
    unknown verb or option, a missing argument or a bad value raises click's UsageError."""
    import typer

    from arkinfer.cli.main import app

    command = typer.main.get_command(app)
    ctx = command.context_class(command, info_name="arkinfer")
    rest = list(args)
    while hasattr(command, "list_commands"):  # a group: its sub-command is the first positional
        at = next((i for i, a in enumerate(rest) if not a.startswith("-")), None)
        if at is None:
            break
        if at:  # the group's own options, e.g. `arkinfer targets --json show ID`
            command.make_context(ctx.info_name, rest[:at], parent=ctx.parent)
        name, command, rest = command.resolve_command(ctx, rest[at:])  # unknown: UsageError
        ctx = command.context_class(command, info_name=name, parent=ctx)
    command.make_context(ctx.info_name, rest, parent=ctx.parent)


def extras_named(argv: list[str]) -> set[str]:
    """The extras of `pkg[a,b]` / `.[a,b]` requirements in a pip command."""
    found = set()
    for arg in argv:
        match = re.search(r"\[([A-Za-z0-9_,\-]+)\]$", arg)
        if match and not arg.startswith("-"):
            found |= set(match.group(1).split(","))
    return found


def pinned(argv: list[str]) -> dict[str, str]:
    return dict(arg.split("==", 1) for arg in argv if "==" in arg and not arg.startswith("-"))


def check_pip(argv: list[str]) -> None:
    assert argv[1] == "install", f"only `pip install` is checked: {shlex.join(argv)}"
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    unknown = extras_named(argv) - set(project["optional-dependencies"])
    assert not unknown, f"{shlex.join(argv)}: extras {sorted(unknown)} not in pyproject.toml"
    constraints = pinned((REPO / "constraints.txt").read_text(encoding="utf-8").split())
    for name, version in pinned(argv).items():
        if name in constraints:
            assert version == constraints[name], (
                f"{shlex.join(argv)}: {name}=={version}, constraints.txt pins {constraints[name]}")


def check_benchmark(argv: list[str]) -> None:
    script = REPO / argv[1]
    assert argv[1].startswith("benchmarks/") and script.is_file(), f"no script {argv[1]}"
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                            text=True, timeout=300, cwd=REPO, check=False,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    for flag in (a.split("=", 1)[0] for a in argv[2:] if a.startswith("-")):
        assert flag in result.stdout, f"{argv[1]} --help does not list {flag}"


def check(argv: list[str]) -> None:
    program = Path(argv[0]).name
    if program == "make":
        missing = set(argv[1:]) - makefile_targets()
        assert not missing, f"make targets {sorted(missing)} are not in the Makefile"
    elif program == "arkinfer":
        parse_arkinfer(argv[1:])
    elif program in ("python", "python3") and len(argv) > 1 and argv[1].endswith(".py"):
        check_benchmark(argv)
    elif program == "pip":
        check_pip(argv)
    else:
        pytest.fail(f"README command of a kind no test checks: {shlex.join(argv)}")


README_COMMANDS = shell_commands(README.read_text(encoding="utf-8"))


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_readme_states_the_two_make_commands():
    assert ["make", "demo"] in README_COMMANDS and ["make", "test"] in README_COMMANDS


def test_readme_shows_what_make_demo_runs():
    for argv in demo_recipe():
        assert argv in README_COMMANDS, f"`{shlex.join(argv)}` (Makefile demo) not in README"


@pytest.mark.parametrize("argv", README_COMMANDS, ids=[shlex.join(a)[:60] for a in README_COMMANDS])
def test_readme_command_is_accepted(argv):
    check(argv)


def test_the_checks_have_teeth():
    try:  # the click that Typer runs on, as arkinfer/cli/main.py imports it
        from typer._click.exceptions import UsageError
    except ImportError:
        from click.exceptions import UsageError

    with pytest.raises(UsageError):
        parse_arkinfer(["build", "demo", "--no-such-option"])
    with pytest.raises(UsageError):
        parse_arkinfer(["bench"])  # ARTIFACT missing
    with pytest.raises(UsageError):
        parse_arkinfer(["no-such-verb", "demo"])
    parse_arkinfer(["targets", "show", "host"])
    parse_arkinfer(["targets", "--json"])
    with pytest.raises(AssertionError):
        check(["make", "no-such-target"])
    with pytest.raises(AssertionError):
        check(["pip", "install", ".[no-such-extra]"])
    assert shell_commands("```bash\nA=1 arkinfer run demo \\\n  -p 'x # y' -n 2  # c\n```\n") == [
        ["arkinfer", "run", "demo", "-p", "x # y", "-n", "2"]]


def test_make_demo_commands_run(tmp_path, monkeypatch):
    """The quick start's three commands, as the Makefile runs them, in a fresh folder."""
    from typer.testing import CliRunner

    from arkinfer.cli.main import app

    pytest.importorskip("llama_cpp", reason="the host default backend (gguf) needs [gguf]")
    monkeypatch.chdir(tmp_path)
    for argv in demo_recipe():
        assert argv[0] == "arkinfer"
        result = CliRunner().invoke(app, argv[1:])
        assert result.exit_code == 0, f"{shlex.join(argv)}\n{result.output}"
    assert (tmp_path / "dist" / "demo.host.q4_0" / "model.gguf").is_file()
    assert "flour" in result.output  # `arkinfer run demo -p "What is bread made from?"`


def linked_pages() -> list[Path]:
    return [README, REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]


def relative_links(page: Path) -> list[str]:
    """The relative link targets of a markdown page (outside code blocks, anchors dropped)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"),
                  flags=re.DOTALL | re.MULTILINE)
    targets = [t.split("#", 1)[0] for t in LINK.findall(text)]
    return [t for t in targets if t and not re.match(r"^[a-z]+:", t)]


@pytest.mark.parametrize("page", linked_pages(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_point_at_files(page):
    broken = [t for t in relative_links(page) if not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(REPO)}: broken links {broken}"


def test_every_docs_page_is_reachable_from_the_readme():
    seen, todo = set(), [README]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.is_file():
            continue
        seen.add(page)
        todo += [(page.parent / t).resolve() for t in relative_links(page)]
    unreached = [p.name for p in sorted((REPO / "docs").glob("*.md")) if p.resolve() not in seen]
    assert not unreached, f"docs pages no link from README.md leads to: {unreached}"
