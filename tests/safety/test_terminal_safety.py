"""Hostile text never reaches the terminal (issue #37, item 6).

A manifest `name` of `evil\\x1b[2J\\x1b[31mPWNED\\x1b[0m\\r\\nfake: passed` was printed raw in the
bench table: it cleared the screen and faked a line. Every string that comes from a file or a
model folder (manifest fields, config and target names, paths) is now printed through
`terminal_safe`, which shows each control character as a visible escape; error messages get the
same treatment once, in `print_error`. JSON output escapes them by itself (json.dumps).
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arkinfer.cli._output import terminal_safe
from arkinfer.cli.main import app
from arkinfer.frontend.demo import demo_model_path

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()
EVIL = "evil\x1b[2J\x1b[31mPWNED\x1b[0m\r\nfake: passed"
# What a terminal acts on: ESC, CSI (C1), BEL, backspace, CR, and the right-to-left override.
ACTIVE = ("\x1b", "\x9b", "\x07", "\x08", "\r", "\u202e")
BENCH = ["-p", "4", "-n", "2", "-r", "1", "--warmup", "0"]


def invoke(*args) -> object:
    return runner.invoke(app, [str(a) for a in args])


def assert_inert(out: str) -> None:
    """No character a terminal acts on, and no line that the hostile text started."""
    for char in ACTIVE:
        assert char not in out, (char, out)
    assert not any(line.startswith("fake") for line in out.splitlines()), out


# ------------------------------------------------------------------------- the helper itself
@pytest.mark.parametrize("raw,shown", [
    ("\x1b[2J", "\\x1b[2J"), ("a\r\nb", "a\\r\\nb"), ("\t", "\\t"), ("\x00", "\\x00"),
    ("\x7f", "\\x7f"), ("\x9b31m", "\\x9b31m"), ("\u202egnp.exe", "\\u202egnp.exe"),
    ("\u2028", "\\u2028"), ("caf\udce9", "caf\\xe9"),  # a file-name byte that is not UTF-8
    ("plain ü 漢字 [x] ✓", "plain ü 漢字 [x] ✓"),
])
def test_terminal_safe_shows_control_characters_as_escapes(raw, shown):
    assert terminal_safe(raw) == shown


def test_terminal_safe_keeps_what_it_is_told_to():
    assert terminal_safe("a\nb\tc\x1b", keep="\n\t") == "a\nb\tc\\x1b"
    assert terminal_safe(3.5) == "3.5"


def test_print_error_escapes_file_derived_text(capsys):
    from arkinfer.cli._errors import print_error

    print_error(f"manifest name {EVIL!s} is bad\n  second line of the message", f"hint {EVIL}")
    err = capsys.readouterr().err
    assert_inert(err)
    lines = err.splitlines()
    assert [line.split(":")[0] for line in lines] == ["error", "  second line of the message",
                                                      "hint"], err
    assert "\\x1b[2J" in err and "\\r\\nfake: passed" in err


# ------------------------------------------------------------- bench and verify of an artifact
@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("terminal") / "art"
    res = invoke("build", "demo", "--target", "host", "--quant", "f32", "-o", out)
    assert res.exit_code == 0, res.output
    return out


def _hostile_copy(artifact: Path, tmp_path: Path, **fields) -> Path:
    copy = tmp_path / "art"
    shutil.copytree(artifact, copy)
    path = copy / "arkinfer.json"
    manifest = json.loads(path.read_text())
    manifest.update(fields)
    path.write_text(json.dumps(manifest))
    return copy


def test_bench_markdown_table_escapes_the_manifest_name(artifact, tmp_path):
    res = invoke("bench", _hostile_copy(artifact, tmp_path, name=EVIL + "|x"), *BENCH)
    assert res.exit_code == 0, res.output
    assert_inert(res.output)
    rows = [line for line in res.output.splitlines() if line.startswith("| evil")]
    assert len(rows) == 2, res.output  # pp and tg, each on one line
    assert all(row.count(" | ") == 10 for row in rows), rows  # the `|` added no column
    assert "evil\\x1b[2J\\x1b[31mPWNED\\x1b[0m\\r\\nfake: passed\\|x" in rows[0]


def test_bench_csv_escapes_the_manifest_name(artifact, tmp_path):
    res = invoke("bench", _hostile_copy(artifact, tmp_path, name=EVIL), *BENCH, "-f", "csv")
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "\nfake" not in res.output
    rows = list(csv.DictReader(io.StringIO(res.output)))
    assert [r["model_filename"] for r in rows] == [terminal_safe(EVIL)] * 2


def test_bench_json_keeps_the_name_exact_and_escaped(artifact, tmp_path):
    res = invoke("bench", _hostile_copy(artifact, tmp_path, name=EVIL), *BENCH, "-f", "json")
    assert res.exit_code == 0, res.output
    assert_inert(res.output)
    assert [r["model_filename"] for r in json.loads(res.output)] == [EVIL] * 2


def test_verify_escapes_manifest_text(artifact, tmp_path):
    source = json.loads((artifact / "arkinfer.json").read_text())["source"]
    folder = tmp_path / f"src{EVIL}"
    shutil.copytree(demo_model_path(), folder,
                    ignore=shutil.ignore_patterns("__init__.py", "__pycache__"))
    copy = _hostile_copy(artifact, tmp_path, name=EVIL, source={**source, "path": str(folder)})
    res = invoke("verify", copy)
    assert_inert(res.output)
    assert "src" in res.output and "\\x1b[2J" in res.output, res.output


# ------------------------------------------------------------------ other commands, other files
def test_inspect_escapes_the_model_path(tmp_path):
    folder = tmp_path / f"model{EVIL}"
    shutil.copytree(demo_model_path(), folder,
                    ignore=shutil.ignore_patterns("__init__.py", "__pycache__"))
    res = invoke("inspect", folder)
    assert res.exit_code == 0, res.output
    assert_inert(res.output)
    assert "model" + terminal_safe(EVIL) in res.output


def test_error_naming_a_hostile_path_is_escaped(tmp_path):
    res = invoke("run", tmp_path / f"missing{EVIL}", "-p", "hi")
    assert res.exit_code != 0
    assert_inert(res.output)
    assert sum(line.startswith("error:") for line in res.output.splitlines()) == 1, res.output


def test_targets_show_escapes_profile_text(tmp_path):
    profile = (Path(__file__).resolve().parents[2] / "targets" / "host.toml").read_text()
    hostile = json.dumps(EVIL)  # a TOML basic string takes JSON's escapes
    text = profile.replace('name = "', f"name = {hostile[:-1]}", 1)
    (tmp_path / "evil.toml").write_text(text)
    res = invoke("targets", "show", tmp_path / "evil.toml")
    assert res.exit_code == 0, res.output
    assert_inert(res.output)
    assert terminal_safe(EVIL) + "This machine" in res.output


def test_plan_and_matrix_tables_escape_cells(capsys):
    from arkinfer.cli._output import print_kv, print_table

    print_table(f"t {EVIL}", ["a", f"b{EVIL}"], [[EVIL, 1]])
    print_kv(EVIL, [(EVIL, EVIL)])
    out = capsys.readouterr().out
    assert_inert(out)
    assert out.count("\n") == 5, out  # title, header, row; title, one key/value line
