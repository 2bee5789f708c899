"""`arkinfer matrix`: the matrix table in the target profiles, cell selection, preflight, and real
runs on the demo model checked against the index schema and the artifacts on disk.

The run tests call the real CLI in a child process (the way CI does): cells build with the real
backends (llama.cpp for q4_0 on host, the reference backend for ort4), fail a real parity gate,
and skip a backend that is not installed (tvm for android's ort4, hidden from the process the way
a machine without apache-tvm sees it: `sys.modules["tvm"] = None` makes find_spec return None).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arkinfer.errors import ArkError, TargetError
from arkinfer.matrix import index as ix
from arkinfer.matrix.preflight import decide
from arkinfer.matrix.run import cell_thresholds, check_thresholds
from arkinfer.matrix.table import Cell, select_cells
from arkinfer.pipeline.manifest import read_manifest, sha256_file
from arkinfer.targets import list_targets
from arkinfer.targets.schema import parse_profile

FAST_BENCH = "-p 16 -n 4 -r 1 --warmup 0"


# ---------------------------------------------------------------------------- the matrix table

def test_shipped_matrix_tables_resolve_on_their_targets():
    """Every preset a shipped profile ships is a known --quant value its target can run (the
    same resolver `build` uses), and every device runner is named after its target."""
    from arkinfer.frontend.checkpoint import read_config, resolve_model_path
    from arkinfer.resolve import quant_names, resolve

    raw = read_config(resolve_model_path("demo"))
    shipped = [t for t in list_targets() if t.matrix.presets]
    assert {t.id for t in shipped} == {t.id for t in list_targets()}
    for t in shipped:
        for preset in t.matrix.presets:
            assert preset in quant_names(), (t.id, preset)
            assert resolve(preset, raw, t).scheme == preset
        if t.matrix.device_labels:
            assert t.matrix.device_labels == ("self-hosted", t.id)


PROFILE = """schema = 1
[device]
id = "board"
name = "Board"
vendor = "me"
default_backend = "gguf"
measured_at_runtime = true
[capabilities]
dtypes = ["f32"]
[backends.gguf]
quant_formats = ["gguf-q4_0"]
[codegen]
source = "test"
"""


@pytest.mark.parametrize("table, message", [
    ('[matrix]\npresets = ["q4_0"]\nrunner = "x"\n', "unknown key 'runner'"),
    ('[matrix]\ndevice_labels = ["self-hosted"]\n', "missing key 'presets'"),
    ('[matrix]\npresets = ["Q4_0"]\n', "presets entry 'Q4_0'"),
    ('[matrix]\npresets = ["q4_0", "q4_0"]\n', "lists an entry twice"),
    ('[matrix]\npresets = ["q4_0"]\ndevice_labels = ["board"]\n', "must include 'self-hosted'"),
])
def test_matrix_table_errors_name_the_problem(table, message):
    with pytest.raises(TargetError, match=message) as exc:
        parse_profile(PROFILE + table, "board.toml", "board.toml")
    assert "table 'matrix'" in exc.value.message


def test_matrix_table_is_optional_and_parsed():
    assert parse_profile(PROFILE, "b.toml", "b.toml").matrix.presets == ()
    t = parse_profile(PROFILE + '[matrix]\npresets = ["q4_0"]\n'
                      'device_labels = ["self-hosted", "Board-1"]\n', "b.toml", "b.toml")
    assert t.matrix.presets == ("q4_0",) and t.matrix.device_labels == ("self-hosted", "Board-1")
    assert t.to_dict()["matrix"] == {"presets": ["q4_0"],
                                     "device_labels": ["self-hosted", "Board-1"]}


def test_select_cells_default_and_explicit(tmp_path):
    by_default = select_cells("jetson-orin,rpi5", "default")
    assert [c.name for c in by_default] == ["jetson-agx-orin-64gb.marlin",
                                            "jetson-agx-orin-64gb.q4_0", "rpi5-8gb.q4_0",
                                            "rpi5-8gb.q8_0"]
    assert by_default[0].device_labels == ("self-hosted", "jetson-agx-orin-64gb")
    explicit = select_cells("host,android", "Q4_0,fp16")
    assert [c.name for c in explicit] == ["host.q4_0", "host.f16", "android-sd8gen3.q4_0",
                                          "android-sd8gen3.f16"]
    assert len(select_cells("all", "default")) == sum(len(t.matrix.presets)
                                                      for t in list_targets())
    own = tmp_path / "board.toml"
    own.write_text(PROFILE + '[matrix]\npresets = ["q4_0"]\n')
    [cell] = select_cells(str(own), "default")
    assert (cell.name, cell.target_arg) == ("board.q4_0", str(own))


@pytest.mark.parametrize("targets, quant, message", [
    ("host", "q9_9", "unknown --quant 'q9_9'"),
    ("all,host", "default", "mixes 'all'"),
    ("host", "default,q4_0", "mixes 'default'"),
    ("no-such-board", "default", "unknown target 'no-such-board'"),
    (" , ", "default", "names nothing"),
])
def test_select_cells_refuses_bad_names(targets, quant, message):
    with pytest.raises(ArkError, match=message):
        select_cells(targets, quant)


def test_thresholds_apply_per_cell():
    cells = [Cell("host", "q4_0", "host"), Cell("host", "ort4", "host")]
    items = ("kl=0.4", "host.ort4:top1=1", "q4_0:ppl_delta=0.3")
    assert cell_thresholds(items, cells[0]) == ("kl=0.4", "ppl_delta=0.3")
    assert cell_thresholds(items, cells[1]) == ("kl=0.4", "top1=1")
    check_thresholds(items, cells)
    with pytest.raises(ArkError, match="names no selected cell"):
        check_thresholds(("rpi5-8gb.q4_0:top1=0.5",), cells)
    with pytest.raises(ArkError, match="top1=2.0 is not allowed"):
        check_thresholds(("host.q4_0:top1=2",), cells)


# ---------------------------------------------------------------------------- preflight

def test_preflight_skips_refuses_and_guards_the_output(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tvm", None)  # apache-tvm not installed
    [tvm] = select_cells("android", "ort4")
    skipped = decide(tvm, "demo", tmp_path / tvm.name)
    assert skipped.status == "skipped" and "tvm" in skipped.reason and skipped.hint
    [wrong] = select_cells("rpi5", "marlin")  # rpi5 runs llama.cpp only: no Marlin layout
    refused = decide(wrong, "demo", tmp_path / wrong.name)
    assert refused.status == "refused" and "marlin" in refused.reason
    [ok] = select_cells("host", "q4_0")
    users = tmp_path / ok.name
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    blocked = decide(ok, "demo", users)
    assert blocked.status == "failed" and "not an ArkInfer artifact" in blocked.reason
    assert (users / "notes.txt").read_text() == "mine"
    ready = decide(ok, "demo", tmp_path / "fresh")
    assert ready.status == "ready" and ready.plan.backend == ready.plan.target.default_backend


# ---------------------------------------------------------------------------- index and summary

def _entry(name: str, status: str, **extra) -> dict:
    target, preset = name.split(".")
    return {**ix.blank_entry(Cell(target, preset, target), status), **extra}


def test_merge_prefers_the_most_informative_entry_and_validates():
    a = ix.new_index("demo", Path("/src"), ("-p", "16"))
    b = ix.new_index("demo", Path("/src"), ("-p", "16"))
    a["cells"] = [_entry("host.q4_0", "pending"), _entry("rpi5-8gb.q4_0", "skipped",
                                                         reason="r", hint="h")]
    b["cells"] = [_entry("host.q4_0", "failed", reason="build: error: x")]
    merged = ix.merge_indexes([a, b])
    ix.validate_index(merged)
    assert [(e["name"], e["status"]) for e in merged["cells"]] == [
        ("host.q4_0", "failed"), ("rpi5-8gb.q4_0", "skipped")]
    with pytest.raises(ix.IndexFileError, match="different models"):
        ix.merge_indexes([a, {**b, "model": "other"}])
    bad = {**a, "cells": [{**a["cells"][0], "status": "done"}]}
    with pytest.raises(ix.IndexFileError, match="cells/0/status"):
        ix.validate_index(bad)


def test_summary_without_matplotlib_says_so(tmp_path, monkeypatch):
    from arkinfer.matrix import summary

    index = ix.new_index("demo", Path("/src"), ())
    index["cells"] = [_entry("host.q4_0", "failed", reason="build: error: a | b")]

    def no_matplotlib(*a, **k):
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(summary, "write_plot", no_matplotlib)
    paths, note = summary.write_summary(tmp_path, index)
    text = (tmp_path / "summary.md").read_text()
    assert paths == [tmp_path / "summary.md"] and "matplotlib is not installed" in note
    assert "matplotlib is not installed" in text and "build: error: a \\| b" in text


# ---------------------------------------------------------------------------- real runs

def matrix(cwd: Path, *args: str, timeout: float = 900,
           hide: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`arkinfer matrix ARGS` in a fresh process; `hide`: packages that process cannot import
    (as on a machine without them)."""
    start = ("import sys; sys.modules.update(dict.fromkeys(sys.argv.pop(1).split(','))); "
             "from arkinfer.cli.main import main; sys.argv[0] = 'arkinfer'; main()")
    return subprocess.run([sys.executable, "-c", start, ",".join(hide) or "-", "matrix", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


def check_index_against_disk(folder: Path) -> dict:
    """index.json matches its schema, and every entry matches the files beside it."""
    index = ix.read_index(folder)
    assert index is not None
    for e in index["cells"]:
        art = folder / e["name"]
        if e["status"] in ("built", "up_to_date"):
            assert e["path"] == e["name"] and art.is_dir()
            manifest = read_manifest(art)
            assert e["manifest_sha256"] == sha256_file(art / "arkinfer.json")
            files = [p for p in art.rglob("*") if p.is_file()]
            assert e["sizes"]["files"] == len(files) == len(manifest["files"]) + 1
            assert e["sizes"]["artifact_bytes"] == sum(p.stat().st_size for p in files)
            assert e["sizes"]["weights_bytes"] == manifest["memory"]["weights_bytes"]
            assert e["verify"]["passed"] and e["verify"]["metrics"] == \
                manifest["verification"]["metrics"]
            assert e["backend"] == manifest["backend"]["name"]
            rows = json.loads((folder / e["bench"]["file"]).read_text())
            assert rows == e["bench"]["rows"] and e["decode"]["measured_ts"] > 0
            assert e["decode"]["measured_ts"] == next(
                r["avg_ts"] for r in rows if r["test"].startswith("tg"))
        else:
            assert e["path"] is None and e["manifest_sha256"] is None and e["bench"] is None
            assert e["reason"]
    return index


def test_matrix_run_builds_skips_fails_and_resumes(tmp_path):
    """Six cells at -j 2: host.q4_0 builds (llama.cpp), host.ort4 fails a parity gate it cannot
    meet, both android cells are skipped (their backend, tvm, is hidden: not installed), rpi5.ort4
    is refused (rpi5 runs llama.cpp only), rpi5.q4_0 fails before any work because a user's folder
    is where its artifact would go (and the folder is untouched).
    A second run finds host.q4_0 current in seconds."""
    users = tmp_path / "dist" / "demo" / "rpi5-8gb.q4_0"
    users.mkdir(parents=True)
    (users / "notes.txt").write_text("mine")
    (tmp_path / "dist" / "demo" / "index.json").write_text(json.dumps(
        ix.new_index("demo", Path("x"), ())))  # so the folder is ArkInfer's matrix folder
    run = matrix(tmp_path, "demo", "--targets", "host,android,rpi5", "--quant", "q4_0,ort4",
                 "-j", "2", "--bench-args", FAST_BENCH, "--threshold", "host.ort4:top1=1",
                 hide=("tvm",))
    assert run.returncode == 1, run.stderr
    assert "2 of 6 cells failed: host.ort4, rpi5-8gb.q4_0" in run.stderr, run.stderr
    folder = tmp_path / "dist" / "demo"
    index = check_index_against_disk(folder)
    by = {e["name"]: e for e in index["cells"]}
    assert {n: e["status"] for n, e in by.items()} == {
        "host.q4_0": "built", "host.ort4": "failed", "android-sd8gen3.ort4": "skipped",
        "android-sd8gen3.q4_0": "skipped", "rpi5-8gb.ort4": "refused",
        "rpi5-8gb.q4_0": "failed"}
    assert "top1_agreement" in by["host.ort4"]["reason"] and not (folder / "host.ort4").exists()
    assert by["host.ort4"]["backend"] == "reference"
    assert "tvm" in by["android-sd8gen3.ort4"]["reason"] and by["android-sd8gen3.ort4"]["hint"]
    assert "not an ArkInfer artifact" in by["rpi5-8gb.q4_0"]["reason"]
    assert (users / "notes.txt").read_text() == "mine"
    summary = (folder / "summary.md").read_text()
    assert "top1_agreement" in summary and "| `host.q4_0` | ✅ built | gguf |" in summary
    assert (folder / "summary.png").stat().st_size > 1000
    assert "$ arkinfer build demo -t host -q ort4" in (folder / "logs" / "host.ort4.log").read_text()

    t0 = time.perf_counter()
    again = matrix(tmp_path, "demo", "--targets", "host", "--quant", "q4_0", "--bench-args",
                   FAST_BENCH, "--json")
    seconds = time.perf_counter() - t0
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    by2 = {e["name"]: e for e in second["cells"]}
    assert by2["host.q4_0"]["status"] == "up_to_date" and by2["host.q4_0"]["seconds"]["total"] < 5
    for key in ("manifest_sha256", "sizes", "bench", "decode"):
        assert by2["host.q4_0"][key] == by["host.q4_0"][key]
    assert by2["host.ort4"] == by["host.ort4"]  # cells not selected keep their entries
    assert seconds < 60, seconds  # process start-up on a loaded 2-core machine included
    check_index_against_disk(folder)


def _comparable(index: dict) -> dict:
    """index.json without what changes between runs: times, measured speeds, bench samples, and
    whether a finished cell was built by this run or found current (built / up_to_date)."""
    out = []
    for e in index["cells"]:
        e = {k: v for k, v in e.items() if k not in ("seconds", "bench", "decode")}
        e["status"] = {"up_to_date": "built"}.get(e["status"], e["status"])
        if e["verify"]:  # "build" (gate run now) or "recorded" (a current artifact's)
            e["verify"] = {k: v for k, v in e["verify"].items() if k != "how"}
        out.append(e)
    return {k: v for k, v in index.items() if k != "updated"} | {"cells": out}


@pytest.mark.heavy
def test_killed_run_resumes_to_the_same_index(tmp_path):
    """SIGTERM a -j 1 run after its first cell finished; the rerun keeps that cell (current),
    builds only the rest and ends with the index a clean run writes (apart from timings)."""
    args = ["demo", "--targets", "host", "--quant", "q4_0,q8_0", "--bench-args", FAST_BENCH]
    proc = subprocess.Popen([sys.executable, "-m", "arkinfer.cli.main", "matrix", *args],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    folder = tmp_path / "dist" / "demo"
    deadline = time.time() + 600
    while time.time() < deadline:
        index = ix.read_index(folder) if (folder / "index.json").exists() else None
        if index and any(e["status"] == "built" for e in index["cells"]):
            break
        time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    killed = ix.read_index(folder)
    assert sorted(e["status"] for e in killed["cells"]) == ["built", "pending"]
    assert not [p for p in folder.iterdir() if ".building-" in p.name or ".work-" in p.name]
    resumed = matrix(tmp_path, *args)
    assert resumed.returncode == 0, resumed.stderr
    final = check_index_against_disk(folder)
    assert sorted(e["status"] for e in final["cells"]) == ["built", "up_to_date"]
    clean = tmp_path / "clean"
    clean.mkdir()
    assert matrix(clean, *args).returncode == 0
    reference = ix.read_index(clean / "dist" / "demo")
    a, b = _comparable(final), _comparable(reference)
    for e in a["cells"] + b["cells"]:  # each manifest records its own build's stage timings
        e.pop("manifest_sha256")
        e["sizes"].pop("artifact_bytes")
    a.pop("source"), b.pop("source")
    assert a["cells"] == b["cells"] and a == b


@pytest.mark.heavy
def test_full_demo_matrix_every_installed_backend(tmp_path):
    """`arkinfer matrix demo --targets all --quant default -j 2`: every cell whose backend is
    installed here builds and verifies, the rest are skipped with a reason; a rerun is current."""
    args = ["demo", "--targets", "all", "--quant", "default", "-j", "2", "--bench-args",
            FAST_BENCH, "--build-args", "--samples 16 --seq-len 128"]
    first = matrix(tmp_path, *args, timeout=3600)
    assert first.returncode == 0, first.stderr
    index = check_index_against_disk(tmp_path / "dist" / "demo")
    from arkinfer.backend import backend_names, get_backend

    usable = {b for b in backend_names() if get_backend(b).available()}
    for e in index["cells"]:
        assert e["status"] in ("built", "skipped"), e
        if e["status"] == "skipped":
            assert e["reason"] and e["backend"] not in usable
    again = matrix(tmp_path, *args, "--json", timeout=600)
    assert again.returncode == 0
    assert {e["status"] for e in json.loads(again.stdout)["cells"]} <= {"up_to_date", "skipped"}
