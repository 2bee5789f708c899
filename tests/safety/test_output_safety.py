"""Never destroy a user's files: what `--force` may replace, and replacing atomically (issue #20).

Each case reproduces a report from the hostile-input campaign: `build -o . --force` deleted the
current folder's files, `--force` replaced any folder, `build`/`quantize MODEL -o MODEL --force`
replaced the source checkpoint, and a kill between "delete old" and "rename new" lost both.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arkinfer import output_folder
from arkinfer.cli.main import app
from arkinfer.frontend.demo import demo_model_path
from arkinfer.output_folder import OutputError, check_output, remove_leftovers, replace_folder

runner = CliRunner()
FAST = ["--target", "host", "--quant", "f32"]  # float: no calibration, a build in seconds


def _user_files(folder: Path) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "thesis.tex").write_text("chapter one")
    (folder / "notes").mkdir(exist_ok=True)
    (folder / "notes" / "todo.txt").write_text("finish chapter two")
    return {p.relative_to(folder).as_posix(): p.read_text()
            for p in folder.rglob("*") if p.is_file()}


def _same_files(folder: Path, files: dict[str, str]) -> bool:
    return all((folder / rel).is_file() and (folder / rel).read_text() == text
               for rel, text in files.items())


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _build(*args: str):
    return runner.invoke(app, ["build", *args])


def test_force_into_the_current_folder_is_refused(tmp_path, monkeypatch):
    files = _user_files(tmp_path / "work")
    monkeypatch.chdir(tmp_path / "work")
    res = _build("demo", *FAST, "-o", ".", "--force")
    assert res.exit_code == 1
    assert "current folder" in res.output and "Traceback" not in res.output
    assert _same_files(tmp_path / "work", files)


def test_force_into_a_parent_of_the_current_folder_is_refused(tmp_path, monkeypatch):
    files = _user_files(tmp_path / "home")
    (tmp_path / "home" / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "home" / "sub")
    res = _build("demo", *FAST, "-o", "..", "--force")
    assert res.exit_code == 1 and "current folder" in res.output
    assert _same_files(tmp_path / "home", files)


def test_force_never_replaces_a_folder_that_is_not_an_artifact(tmp_path):
    thesis = tmp_path / "thesis"
    files = _user_files(thesis)
    res = _build("demo", *FAST, "-o", str(thesis), "--force")
    assert res.exit_code == 1
    assert "not an ArkInfer artifact" in res.output and "even with --force" in res.output
    assert _same_files(thesis, files) and len(list(thesis.iterdir())) == 2


def test_a_folder_with_a_forged_manifest_is_not_an_artifact(tmp_path):
    folder = tmp_path / "docs"
    files = _user_files(folder)
    (folder / "arkinfer.json").write_text('{"schema_version": 1}')
    res = _build("demo", *FAST, "-o", str(folder), "--force")
    assert res.exit_code == 1 and "not an ArkInfer artifact" in res.output
    assert _same_files(folder, files)


def test_build_never_writes_over_the_source_model(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(demo_model_path(), model)
    before = {str(p.relative_to(model)): p.read_bytes() for p in model.rglob("*") if p.is_file()}
    for out in (model, tmp_path):  # the model folder itself, and a folder containing it
        res = _build(str(model), *FAST, "-o", str(out), "--force")
        assert res.exit_code == 1 and "source model" in res.output, res.output
    assert {str(p.relative_to(model)): p.read_bytes() for p in model.rglob("*") if p.is_file()} == before


def test_quantize_never_writes_over_the_source_model(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(demo_model_path(), model)
    before = {str(p.relative_to(model)): p.read_bytes() for p in model.rglob("*") if p.is_file()}
    res = runner.invoke(app, ["quantize", str(model), "--preset", "q4_0", "-o", str(model),
                              "--force", "--samples", "2", "--seq-len", "32"])
    assert res.exit_code == 1 and "source model" in res.output, res.output
    assert "calibrat" not in res.output.lower().split("error")[0]  # refused before any work
    assert {str(p.relative_to(model)): p.read_bytes() for p in model.rglob("*") if p.is_file()} == before


def test_quantize_force_refuses_a_foreign_folder(tmp_path):
    folder = tmp_path / "mine"
    files = _user_files(folder)
    res = runner.invoke(app, ["quantize", "demo", "--preset", "q4_0", "-o", str(folder),
                              "--force", "--samples", "2", "--seq-len", "32"])
    assert res.exit_code == 1 and "not an ArkInfer quantised folder" in res.output
    assert _same_files(folder, files)


def test_force_replaces_an_existing_artifact_and_an_empty_folder_needs_no_force(tmp_path):
    out = tmp_path / "art"
    out.mkdir()  # empty: nothing can be lost
    assert _build("demo", *FAST, "-o", str(out)).exit_code == 0
    first = json.loads((out / "arkinfer.json").read_text())["created"]
    res = _build("demo", *FAST, "-o", str(out))
    assert res.exit_code == 1 and "--force" in res.output
    res = _build("demo", *FAST, "-o", str(out), "--force")
    assert res.exit_code == 0, res.output
    assert (out / "arkinfer.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["art"], "no staging or old folder left"
    assert json.loads((out / "arkinfer.json").read_text())["created"] >= first


def test_output_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "report.pdf"
    f.write_text("pdf")
    with pytest.raises(OutputError, match="not a folder"):
        check_output(f, force=True, what="artifact", record=lambda p: {})
    assert f.read_text() == "pdf"


def _folder(path: Path, text: str) -> Path:
    path.mkdir()
    (path / "a.txt").write_text(text)
    (path / "b.txt").write_text(text)
    return path


def _old_and_new(tmp_path: Path) -> tuple[Path, Path]:
    return _folder(tmp_path / "out", "old"), _folder(tmp_path / ".out.building-1", "new")


def test_replace_folder_swaps_complete_folders(tmp_path):
    out, new = _old_and_new(tmp_path)
    replace_folder(new, out)
    assert (out / "a.txt").read_text() == "new" and (out / "b.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_replace_folder_without_an_atomic_exchange_sets_the_old_one_aside(tmp_path, monkeypatch):
    monkeypatch.setattr(output_folder, "_exchange", lambda a, b: False)
    out, new = _old_and_new(tmp_path)
    real_replace = os.replace
    seen: list[list[str]] = []

    def spy(a, b):
        # at every rename, `out` or the set-aside copy holds one complete folder
        real_replace(a, b)
        seen.append(sorted(p.name for p in tmp_path.iterdir()))

    monkeypatch.setattr(output_folder.os, "replace", spy)
    replace_folder(new, out)
    assert (out / "a.txt").read_text() == "new"
    assert any(name.startswith(".out.old-") for name in seen[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_second_rename_puts_the_old_folder_back(tmp_path, monkeypatch):
    monkeypatch.setattr(output_folder, "_exchange", lambda a, b: False)
    out, new = _old_and_new(tmp_path)
    real_replace = os.replace
    calls = []

    def flaky(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed between the renames")
        real_replace(a, b)

    monkeypatch.setattr(output_folder.os, "replace", flaky)
    with pytest.raises(KeyboardInterrupt):
        replace_folder(new, out)
    monkeypatch.setattr(output_folder.os, "replace", real_replace)
    assert (out / "a.txt").read_text() == "old"


def test_a_kill_between_the_renames_is_recovered_by_the_next_run(tmp_path):
    """kill -9 after "rename old aside" and before "rename new in": the next build of the same
    name puts the old artifact back and removes the stranded new one."""
    out = tmp_path / "out"
    pid = _dead_pid()
    _folder(tmp_path / f".out.old-{pid}", "old")
    (_folder(tmp_path / f".out.building-{pid}", "new") / output_folder.MARKER).write_text("{}")
    remove_leftovers(out)
    assert (out / "a.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_leftovers_of_a_live_process_are_kept(tmp_path):
    out = tmp_path / "out"
    live = tmp_path / f".out.building-{os.getpid()}"
    live.mkdir()
    remove_leftovers(out)
    assert live.is_dir()


def test_a_killed_import_leaves_nothing_behind_after_the_next_import(tmp_path):
    from arkinfer.frontend import gguf_import

    out = tmp_path / "hf"
    stale = tmp_path / f".hf.importing-{_dead_pid()}-0a1b2c3d"
    stale.mkdir()
    (stale / output_folder.MARKER).write_text("{}")
    (stale / "model-00001-of-00001.safetensors").write_bytes(b"partial")
    (tmp_path / "x.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    try:
        gguf_import.import_gguf(tmp_path / "x.gguf", out)
    except Exception:  # noqa: BLE001 - the GGUF is junk; the leftover must be gone regardless
        pass
    assert not stale.exists()


def test_import_force_refuses_a_foreign_folder(tmp_path):
    folder = tmp_path / "mine"
    files = _user_files(folder)
    (tmp_path / "x.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    res = runner.invoke(app, ["import", str(tmp_path / "x.gguf"), str(folder), "--force"])
    assert res.exit_code == 1 and "not an ArkInfer import" in res.output, res.output
    assert _same_files(folder, files)
