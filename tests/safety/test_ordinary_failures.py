"""Ordinary conditions are ordinary errors (issue 37, item 10): a full disk during `build` and
`quantize`, folder names that are not UTF-8 (`bench`, `verify`, `build -o`), running out of
threads or memory — one `error:` line and one `hint:`, never "this is a bug in ArkInfer" — and
two `arkinfer doctor --remeasure` at once measure one after the other, not under each other's
load.
"""

from __future__ import annotations

import errno
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arkinfer.cli._errors import error_message, report
from arkinfer.cli.main import app

runner = CliRunner()
NOT_UTF8 = os.fsdecode(b"art\xff\xfe")  # what Python makes of a folder named b'art\xff\xfe'


def assert_ordinary(result, *needles: str) -> str:
    """Exit 1, exactly one `error:` and one `hint:` line, no traceback, no "bug"."""
    out = result.output
    assert result.exit_code == 1, out
    lines = out.splitlines()
    assert sum(line.startswith("error:") for line in lines) == 1, out
    assert sum(line.startswith("hint:") for line in lines) == 1, out
    assert "Traceback" not in out and "this is a bug" not in out, out
    for needle in needles:
        assert needle in out, out
    return out


# -- folder names that are not UTF-8 ---------------------------------------------------------------

@pytest.fixture(scope="module")
def odd_artifact(tmp_path_factory) -> Path:
    """`build -o` into a folder whose name is not UTF-8 (llama.cpp took the path as UTF-8 and
    raised UnicodeEncodeError, reported as a bug): now it builds and verifies."""
    out = tmp_path_factory.mktemp("odd") / NOT_UTF8
    result = runner.invoke(app, ["build", "demo", "--target", "host", "--quant", "f32",
                                 "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_build_verify_and_bench_work_in_a_folder_named_with_non_utf8_bytes(odd_artifact):
    assert (odd_artifact / "arkinfer.json").is_file()
    result = runner.invoke(app, ["verify", str(odd_artifact)])
    assert result.exit_code == 0 and "passed" in result.output, result.output
    result = runner.invoke(app, ["bench", str(odd_artifact), "-p", "8", "-n", "4", "-r", "1",
                                 "--warmup", "0"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("command", ["bench", "verify"])
def test_a_missing_non_utf8_folder_prints_visible_escapes(tmp_path, command):
    result = runner.invoke(app, [command, str(tmp_path / NOT_UTF8)])
    out = assert_ordinary(result, "\\xff\\xfe")
    assert "\\udc" not in out


def test_an_os_error_on_a_non_utf8_path_prints_visible_escapes(capsys):
    report(OSError(errno.ENOENT, "No such file or directory", os.fsencode(NOT_UTF8)))
    err = capsys.readouterr().err
    assert "error: art\\xff\\xfe: No such file or directory (ENOENT)" in err, err


def test_a_unicode_error_names_the_text_and_is_not_a_bug(capsys):
    try:
        f"/data/{NOT_UTF8}/model.gguf".encode("utf-8")
    except UnicodeEncodeError as exc:
        report(exc)
    err = capsys.readouterr().err
    assert "error: '/data/art\\xff\\xfe/model.gguf' holds bytes that are not UTF-8" in err, err
    assert "hint:" in err and "bug" not in err
    try:
        b"caf\xe9".decode("utf-8")
    except UnicodeDecodeError as exc:
        report(exc)
    err = capsys.readouterr().err
    assert "b'\\xe9' at offset 3" in err and "bug" not in err, err


# -- full disk -------------------------------------------------------------------------------------

def test_safetensors_enospc_is_ordinary(monkeypatch, tmp_path):
    """`quantize` on a full disk: safetensors raises its own SafetensorError("... No space left
    on device (os error 28)"), which was reported as a bug."""
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device "
                              "(os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    result = runner.invoke(app, ["quantize", "demo", "--method", "rtn", "--format", "gptq",
                                 "-o", str(tmp_path / "q")])
    assert_ordinary(result, "No space left on device", "ENOSPC", "the disk is full")


def test_gguf_short_write_is_ordinary(monkeypatch, tmp_path):
    """`build` on a full disk: numpy's `tofile` in gguf-py raises OSError("16384 requested and
    13800 written") with no errno, which was reported as a bug."""
    import gguf

    def short(self, *args, **kwargs):
        raise OSError("16384 requested and 13800 written")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", short)
    result = runner.invoke(app, ["build", "demo", "--quant", "f32", "-o", str(tmp_path / "a")])
    assert_ordinary(result, "written", "the disk is probably full", "free space")


@pytest.fixture
def tiny_disk(tmp_path):
    """A 2 MiB tmpfs (root only; skipped where mounting is not permitted)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                       check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here ({exc}): the monkeypatched tests cover ENOSPC")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True, timeout=30)


@pytest.mark.parametrize("args", [
    ["build", "demo", "--quant", "f32"],
    ["quantize", "demo", "--method", "rtn", "--format", "gptq"],
])
def test_a_real_full_disk_is_ordinary(tiny_disk, args):
    """A 2 MB disk: refused before any work, naming the bytes needed and free (the disk-space
    check, arkinfer/disk_space.py); a write that still meets ENOSPC is covered above."""
    result = runner.invoke(app, [*args, "-o", str(tiny_disk / "out")])
    assert_ordinary(result, "needed under", "bytes) free")
    assert list(tiny_disk.iterdir()) == []


# -- threads and memory ----------------------------------------------------------------------------

def test_no_more_threads_and_no_more_memory_are_ordinary():
    message, hint = error_message(RuntimeError("can't start new thread"))
    assert "can't start new thread" in message and "--threads" in hint and "ulimit" in hint
    message, hint = error_message(MemoryError())
    assert message == "not enough memory to finish" and "free memory" in hint
    message, hint = error_message(ZeroDivisionError("x"))  # a real bug is still one
    assert "this is a bug" in hint


# -- two `doctor --remeasure` at once -----------------------------------------------------------

def test_concurrent_remeasures_do_not_measure_under_each_other(monkeypatch, tmp_path):
    """Each measurement used to run while the other loaded the machine, and the cache kept a
    contended bandwidth. Now one measures under the cache's lock; the one that waited takes the
    record measured while it waited."""
    from arkinfer.targets import host

    monkeypatch.setenv("ARKINFER_CACHE", str(tmp_path))
    spans: list[tuple[float, float]] = []

    def measure() -> dict:
        start = time.perf_counter()
        time.sleep(0.3)
        spans.append((start, time.perf_counter()))
        return {"version": host.VERSION, "cpu": host.cpu_model(), "threads": host._threads(),
                "id": uuid.uuid4().hex}

    monkeypatch.setattr(host, "measure_host", measure)
    results: list[dict] = []
    threads = [threading.Thread(target=lambda: results.append(
        host.host_measurement(remeasure=True))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(spans) == 1, spans  # the second caller reused the fresh record
    assert results[0]["id"] == results[1]["id"] == host.load_cached()["id"]
    # a later --remeasure (nothing fresh was written while it waited) measures again
    again = host.host_measurement(remeasure=True)
    assert len(spans) == 2 and again["id"] != results[0]["id"]
