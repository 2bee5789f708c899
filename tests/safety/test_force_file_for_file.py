"""`--force` replaces only what ArkInfer itself wrote, file for file; leftovers are cleaned only
when they carry ArkInfer's marker; nothing is written outside `-o` (issue #37, items 1, 2, 8).

Each test is one reproduction from the second hostile-input campaign: on the code before this
change every one of them lost a user's file or wrote where it was not asked to.
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
from arkinfer.output_folder import MARKER, OutputError, check_output, remove_leftovers

runner = CliRunner()
FAST = ["--target", "host", "--quant", "f32"]  # float: no calibration, a build in seconds


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("art") / "demo.f32"
    res = runner.invoke(app, ["build", "demo", *FAST, "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _copy(artifact: Path, to: Path) -> Path:
    shutil.copytree(artifact, to, symlinks=True)
    return to


def _refused(res, *names: str) -> None:
    assert res.exit_code == 1, res.output
    assert "error:" in res.output and "Traceback" not in res.output and "bug" not in res.output
    for name in names:
        assert name in res.output, (name, res.output)


# -- item 1: --force deletes user files --------------------------------------------------------

def test_quantize_force_keeps_a_folder_whose_only_claim_is_an_empty_summary(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "ch1.txt").write_text("thesis")
    (docs / "quant_summary.json").write_text("{}")
    res = runner.invoke(app, ["quantize", "demo", "--method", "rtn", "--format", "gptq",
                              "-o", str(docs), "--force"])
    _refused(res, "not an ArkInfer quantised folder")
    assert (docs / "ch1.txt").read_text() == "thesis"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs"], "no work folder left"


def test_build_force_names_and_keeps_files_added_to_an_artifact(tmp_path, artifact):
    a2 = _copy(artifact, tmp_path / "a2")
    (a2 / "MY_NOTES.txt").write_text("notes")
    (a2 / "mydata").mkdir()
    (a2 / "mydata" / "x.csv").write_text("1,2")
    res = runner.invoke(app, ["build", "demo", *FAST, "-o", str(a2), "--force"])
    _refused(res, "MY_NOTES.txt", "mydata/", "did not write")
    assert (a2 / "MY_NOTES.txt").read_text() == "notes"
    assert (a2 / "mydata" / "x.csv").read_text() == "1,2"


def test_build_force_keeps_a_folder_holding_a_copied_manifest(tmp_path, artifact):
    d2 = tmp_path / "d2"
    d2.mkdir()
    (d2 / "taxes.pdf").write_text("x")
    shutil.copy(artifact / "arkinfer.json", d2)
    res = runner.invoke(app, ["build", "demo", *FAST, "-o", str(d2), "--force"])
    _refused(res, "taxes.pdf")
    assert (d2 / "taxes.pdf").read_text() == "x"


def test_build_force_keeps_an_artifact_whose_listed_file_was_edited(tmp_path, artifact):
    a3 = _copy(artifact, tmp_path / "a3")
    edited = next(p for p in sorted(a3.rglob("*")) if p.is_file() and p.name != "arkinfer.json")
    edited.write_bytes(edited.read_bytes() + b"my edit")
    res = runner.invoke(app, ["build", "demo", *FAST, "-o", str(a3), "--force"])
    _refused(res, edited.name, "changed since ArkInfer wrote it")
    assert edited.read_bytes().endswith(b"my edit")


def test_build_force_keeps_an_artifact_holding_a_symlink(tmp_path, artifact):
    a4 = _copy(artifact, tmp_path / "a4")
    (a4 / "rootlink").symlink_to("/")
    res = runner.invoke(app, ["build", "demo", *FAST, "-o", str(a4), "--force"])
    _refused(res, "rootlink (a symlink)")
    assert (a4 / "rootlink").is_symlink()


def test_build_force_replaces_its_own_unchanged_artifact(tmp_path, artifact):
    a5 = _copy(artifact, tmp_path / "a5")
    res = runner.invoke(app, ["build", "demo", *FAST, "-o", str(a5), "--force"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a5"], "no staging or work left"
    assert not (a5 / MARKER).exists(), "the staging marker never reaches the artifact"


def test_a_users_hidden_folder_named_like_a_leftover_survives(tmp_path):
    notes = tmp_path / ".a3.work-999999-notes"
    unmarked = tmp_path / f".a3.work-{_dead_pid()}"
    for folder in (notes, unmarked):
        folder.mkdir()
        (folder / "mine.txt").write_text("keep")
    res = runner.invoke(app, ["build", "demo", *FAST, "-o", str(tmp_path / "a3")])
    assert res.exit_code == 0, res.output
    assert (notes / "mine.txt").read_text() == "keep"
    assert (unmarked / "mine.txt").read_text() == "keep"


def test_leftovers_with_the_marker_are_cleaned(tmp_path):
    pid = _dead_pid()
    marked = tmp_path / f".out.building-{pid}"
    marked.mkdir()
    (marked / MARKER).write_text("{}")
    (marked / "model.gguf").write_bytes(b"partial")
    empty = tmp_path / f".out.work-{pid}"
    empty.mkdir()
    assert sorted(remove_leftovers(tmp_path / "out")) == sorted([marked, empty])
    assert list(tmp_path.iterdir()) == []


def test_quantize_work_dir_of_the_users_is_never_emptied(tmp_path):
    mine = tmp_path / "Documents"
    mine.mkdir()
    (mine / "cv.pdf").write_text("cv")
    res = runner.invoke(app, ["quantize", "demo", "--method", "rtn", "--format", "gptq",
                              "-o", str(tmp_path / "q"), "--work-dir", str(mine)])
    _refused(res, "work folder", "ArkInfer did not write")
    assert (mine / "cv.pdf").read_text() == "cv"
    assert not (tmp_path / "q").exists()


def test_quantize_force_replaces_its_own_output_and_refuses_an_added_file(tmp_path):
    q = tmp_path / "q"
    args = ["quantize", "demo", "--method", "rtn", "--format", "gptq", "-o", str(q)]
    assert runner.invoke(app, args).exit_code == 0
    summary = json.loads((q / "quant_summary.json").read_text())
    assert set(summary["files"]) == {p.relative_to(q).as_posix() for p in q.rglob("*")
                                     if p.is_file()} - {"quant_summary.json"}
    res = runner.invoke(app, [*args, "--force"])
    assert res.exit_code == 0, res.output
    (q / "notes.md").write_text("mine")
    _refused(runner.invoke(app, [*args, "--force"]), "notes.md")
    assert (q / "notes.md").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q"], "no work or staging left"


def test_a_mount_point_is_refused_before_any_work(tmp_path, monkeypatch):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    (mnt / "a.txt").write_text("x")
    real = os.path.ismount
    monkeypatch.setattr(output_folder.os.path, "ismount", lambda p: Path(p) == mnt or real(p))
    with pytest.raises(OutputError, match="mount point"):
        check_output(mnt, force=True, what="artifact", record=lambda p: {"a.txt": None})


# -- item 2: matrix --merge writes outside -o ----------------------------------------------------

def _cell_index(tmp_path: Path, model: str) -> Path:
    from arkinfer.frontend.demo import demo_model_path
    from arkinfer.matrix import index as ix

    cell = tmp_path / "cell"
    cell.mkdir()
    data = ix.new_index("demo", demo_model_path(), ())
    data["model"] = model
    (cell / "index.json").write_text(json.dumps(data))
    return cell


@pytest.mark.parametrize("model", ["/abs/victim", "../../victim", "..", "a/b", "x\x1b[2J"])
def test_merge_refuses_a_model_name_that_is_a_path(tmp_path, model):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "index.json").write_text("mine")
    cell = _cell_index(tmp_path, model.replace("/abs/victim", str(victim)))
    out = tmp_path / "out" / "deep"
    out.mkdir(parents=True)
    res = runner.invoke(app, ["matrix", "demo", "--merge", str(cell), "-o", str(out)])
    _refused(res, "not a plain folder name")
    assert (victim / "index.json").read_text() == "mine"
    assert sorted(p.name for p in victim.iterdir()) == ["index.json"]
    assert list(out.iterdir()) == []


def test_a_web_projects_index_json_is_not_a_matrix_folder(tmp_path):
    site = tmp_path / "out" / "demo"
    site.mkdir(parents=True)
    (site / "index.json").write_text('{"pages": ["home"]}')
    (site / "summary.md").write_text("my page")
    res = runner.invoke(app, ["matrix", "demo", "--merge", str(_cell_index(tmp_path, "demo")),
                              "-o", str(tmp_path / "out")])
    _refused(res, "not an ArkInfer matrix folder")
    assert (site / "index.json").read_text() == '{"pages": ["home"]}'
    assert (site / "summary.md").read_text() == "my page"


def test_merge_into_a_matrix_folder_holding_a_users_file_is_refused(tmp_path):
    cell = _cell_index(tmp_path, "demo")
    out = tmp_path / "out"
    assert runner.invoke(app, ["matrix", "demo", "--merge", str(cell), "-o", str(out)]).exit_code == 0
    (out / "demo" / "thesis.tex").write_text("mine")
    res = runner.invoke(app, ["matrix", "demo", "--merge", str(cell), "-o", str(out)])
    _refused(res, "thesis.tex")
    assert (out / "demo" / "thesis.tex").read_text() == "mine"


def test_matrix_never_builds_inside_an_existing_artifact(tmp_path, artifact):
    art = _copy(artifact, tmp_path / "art")
    res = runner.invoke(app, ["matrix", "demo", "-o", str(art), "--targets", "host",
                              "--quant", "f32"])
    _refused(res, "inside", "ArkInfer output")
    assert sorted(p.name for p in art.iterdir()) == sorted(p.name for p in artifact.iterdir())
    assert runner.invoke(app, ["verify", str(art)]).exit_code == 0


# -- item 8: verify passes unlisted non-regular entries -------------------------------------------

def _verify_fails(art: Path, *names: str) -> None:
    res = runner.invoke(app, ["verify", str(art)])
    _refused(res, *names)


def test_verify_refuses_an_unlisted_symlink_to_the_root(tmp_path, artifact):
    art = _copy(artifact, tmp_path / "a")
    (art / "rootlink").symlink_to("/")
    _verify_fails(art, "rootlink", "symlink")


def test_verify_refuses_an_unlisted_fifo_and_a_link_to_a_device(tmp_path, artifact):
    art = _copy(artifact, tmp_path / "a")
    os.mkfifo(art / "pipe")
    (art / "zero").symlink_to("/dev/zero")
    _verify_fails(art, "pipe", "FIFO", "zero")


def test_verify_refuses_a_symlinked_manifest(tmp_path, artifact):
    art = _copy(artifact, tmp_path / "a")
    outside = tmp_path / "manifest-elsewhere.json"
    (art / "arkinfer.json").rename(outside)
    (art / "arkinfer.json").symlink_to(outside)
    _verify_fails(art, "symlink")


def test_verify_lists_a_recorded_nan_metric_as_a_mismatch(tmp_path, artifact):
    art = _copy(artifact, tmp_path / "a")
    manifest = json.loads((art / "arkinfer.json").read_text())
    manifest["verification"]["metrics"]["top1_agreement"] = float("nan")
    manifest["verification"]["thresholds"]["top1"] = float("nan")
    (art / "arkinfer.json").write_text(json.dumps(manifest))
    res = runner.invoke(app, ["verify", str(art), "--json"])
    result = json.loads(res.stdout)
    metrics = {m["metric"] for m in result["recorded_mismatches"]}
    assert {"top1_agreement", "threshold top1"} <= metrics, result["recorded_mismatches"]


def test_import_force_replaces_its_own_import_and_refuses_an_added_file(tmp_path):
    pytest.importorskip("gguf")
    from arkinfer.testing.gguf_synthetic import write_tiny_gguf

    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, "llama")
    out = tmp_path / "hf"
    args = ["import", str(src), str(out)]
    assert runner.invoke(app, args).exit_code == 0
    record = json.loads((out / "arkinfer_import.json").read_text())
    assert set(record["files"]) == {p.name for p in out.iterdir()} - {"arkinfer_import.json"}
    res = runner.invoke(app, [*args, "--force"])
    assert res.exit_code == 0, res.output
    (out / "README.md").write_text("my model card")
    _refused(runner.invoke(app, [*args, "--force"]), "README.md")
    assert (out / "README.md").read_text() == "my model card"


def test_the_record_names_output_folder_knows_are_their_owners_names():
    """output_folder cannot import its owners (they import it): it keeps their names, checked."""
    from arkinfer.frontend.gguf_import import RECORD_NAME
    from arkinfer.pipeline.manifest import MANIFEST_NAME
    from arkinfer.quant.export import SUMMARY_NAME

    assert output_folder.RECORD_NAMES == (MANIFEST_NAME, SUMMARY_NAME, RECORD_NAME)
