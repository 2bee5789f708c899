"""Verify means verified, wrong results never exit 0, and every message is `error:` / `hint:`
(issue #20). Each test reproduces a report from the hostile-input campaign.

One float artifact of the demo model (without its sparse_config, so parity takes seconds) is built
once, by a real `arkinfer build` whose output folder is named `a[/x]` and whose console is forced
to be a terminal (rich read the `[/x]` in `-o 'out[/x]'` as markup and failed after writing).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from arkinfer.cli.main import app
from arkinfer.frontend.demo import demo_model_path

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()
EVAL_TEXT = str(Path(__file__).resolve().parents[2] / "arkinfer" / "data" / "corpus_eval.txt")
NAN_TENSOR = "model.layers.1.mlp.down_proj.weight"


def invoke(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def assert_clean_error(res, *needles: str, code: int = 1) -> None:
    """Exit `code` with one `error:` and one `hint:` line naming `needles`; no traceback or bug."""
    out = res.output
    assert res.exit_code == code, out
    assert out.count("error:") == 1 and out.count("hint:") == 1, out
    assert "Traceback" not in out and "this is a bug" not in out, out
    for needle in needles:
        assert needle in out, (needle, out)


def _copy_demo(folder: Path) -> Path:
    skip = shutil.ignore_patterns("__init__.py", "__pycache__")  # the package's, not the model's
    shutil.copytree(demo_model_path(), folder, ignore=skip)
    return folder


def _dense_demo(folder: Path) -> Path:
    """The demo model without its sparse_config (dense attention: parity in seconds)."""
    _copy_demo(folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("sparse_config")
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def _set_nan(model_dir: Path, name: str = NAN_TENSOR) -> None:
    from safetensors.torch import load_file, save_file

    weight_map = json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"]
    shard = model_dir / weight_map[name]
    tensors = load_file(str(shard))
    tensors[name][3, 5] = float("nan")
    save_file(tensors, str(shard), metadata={"format": "pt"})


def _rehash(artifact: Path, **manifest_edits) -> dict:
    """Update the manifest's sha256/bytes of every listed file (what an attacker does), apply the
    `verification` edits, and return the manifest."""
    path = artifact / "arkinfer.json"
    manifest = json.loads(path.read_text())
    for rel, info in manifest["files"].items():
        data = (artifact / rel).read_bytes()
        info.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    manifest["verification"].update(manifest_edits)
    path.write_text(json.dumps(manifest, indent=2))
    return manifest


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(artifact, the build's console output) of the dense demo, f32, built as `a[/x]`."""
    root = tmp_path_factory.mktemp("verify")
    source = _dense_demo(root / "dense-demo")
    env = {**os.environ, "FORCE_COLOR": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "arkinfer.cli.main", "build", str(source),
                           "--target", "host", "--backend", "reference", "--quant", "f32",
                           "-o", "a[/x]"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root / "a[" / "x]", proc.stdout + proc.stderr


@pytest.fixture
def artifact(built, tmp_path):
    """A private copy of the built artifact to edit."""
    copy = tmp_path / "artifact"
    shutil.copytree(built[0], copy)
    return copy


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory):
    folder = _copy_demo(tmp_path_factory.mktemp("nan") / "nan-demo")
    _set_nan(folder)
    return folder


# ------------------------------------------------------------------ 7: user text is never markup
def test_paths_with_brackets_are_printed_literally(built):
    artifact, output = built
    assert (artifact / "arkinfer.json").is_file()
    assert "MarkupError" not in output and "a[/x]" in output


# ------------------------------------------------------------- 1: verify cannot be talked round
def test_verify_uses_the_schemes_thresholds_not_the_manifests(artifact):
    for shard in (artifact / "model").glob("*.safetensors"):  # zero every tensor, keep headers
        data = bytearray(shard.read_bytes())
        start = 8 + struct.unpack("<Q", data[:8])[0]
        data[start:] = bytes(len(data) - start)
        shard.write_bytes(bytes(data))
    _rehash(artifact, thresholds={"top1": 0, "kl": 1e9, "ppl_delta": 1e9})
    res = invoke("verify", artifact)
    assert_clean_error(res, "failed verification", "top1_agreement", "< threshold 0.99")
    assert "recorded in the manifest vs re-measured" in res.output
    assert "the manifest records the thresholds" in res.output


def test_verify_re_measures_and_reports_edited_metrics(artifact):
    manifest = json.loads((artifact / "arkinfer.json").read_text())
    metrics = {**manifest["verification"]["metrics"], "top1_agreement": 0.5}
    _rehash(artifact, metrics=metrics)
    res = invoke("verify", artifact, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["passed"] and out["source"]["chosen_by"] == "the manifest"
    assert out["recorded_mismatches"] == [
        {"metric": "top1_agreement", "recorded": 0.5, "measured": out["metrics"]["top1_agreement"]}]


def test_verify_refuses_a_float_source_inside_the_artifact(artifact):
    path = artifact / "arkinfer.json"
    manifest = json.loads(path.read_text())
    manifest["source"]["path"] = str(artifact / "model")  # the artifact compared with itself
    manifest["source"]["config_sha256"] = hashlib.sha256(
        (artifact / "model" / "config.json").read_bytes()).hexdigest()
    path.write_text(json.dumps(manifest))
    assert_clean_error(invoke("verify", artifact), "lies inside the artifact", "--source")


# --------------------------------------------------------------------- 2: thresholds are checked
@pytest.mark.parametrize("item,bad", [("top1=nan", "top1=nan"), ("top1=1.5", "top1=1.5"),
                                      ("kl=-1", "kl=-1.0"), ("ppl_delta=inf", "ppl_delta=inf")])
def test_threshold_must_be_finite_and_in_range(tmp_path, item, bad):
    t0 = time.time()
    res = invoke("verify", tmp_path, "--threshold", item)
    key = item.split("=")[0]
    assert_clean_error(res, f"threshold {bad} is not allowed", f"{key} must be a finite number")
    assert time.time() - t0 < 10  # refused before anything is loaded


# ------------------------------------------------------- 3: manifest paths stay inside the folder
@pytest.mark.parametrize("entry,why", [("/etc/passwd", "is absolute"),
                                       ("../../../../etc/passwd", "contains '..'"),
                                       ("model/escape", "outside")])
def test_manifest_paths_must_stay_inside_the_artifact(artifact, entry, why):
    (artifact / "model" / "escape").symlink_to("/etc/passwd")
    path = artifact / "arkinfer.json"
    manifest = json.loads(path.read_text())
    manifest["files"][entry] = {"sha256": "0" * 64, "bytes": 1}
    path.write_text(json.dumps(manifest))
    res = invoke("verify", artifact)
    assert_clean_error(res, entry, why)
    assert str(os.path.getsize("/etc/passwd")) + " bytes" not in res.output


def test_manifest_entry_that_is_not_a_regular_file_is_not_opened(artifact):
    os.mkfifo(artifact / "model" / "pipe")  # opening it to hash would block forever
    path = artifact / "arkinfer.json"
    manifest = json.loads(path.read_text())
    manifest["files"]["model/pipe"] = {"sha256": "0" * 64, "bytes": 0}
    path.write_text(json.dumps(manifest))
    assert_clean_error(invoke("verify", artifact), "model/pipe: not a regular file")


# ------------------------------------------------------------- 4: non-finite logits are errors
@pytest.mark.parametrize("args", [
    ["run", "-p", "hi", "-n", "4"],
    ["eval", "--text", EVAL_TEXT, "--ctx", "64", "--max-windows", "1"]], ids=["run", "eval"])
def test_nan_weights_fail_naming_the_layer(nan_model, args):
    res = invoke(args[0], nan_model, *args[1:])
    assert_clean_error(res, "non-finite logits", "model.layers.1.mlp.down_proj")


def test_nan_weights_in_an_artifact_fail_verify_naming_the_layer(artifact):
    _set_nan(artifact / "model")
    _rehash(artifact)
    res = invoke("verify", artifact)
    assert_clean_error(res, "non-finite logits", "model.layers.1.mlp.down_proj")


def test_nonfinite_logits_from_any_runner_fail_parity():
    from arkinfer.generate import NonFiniteError
    from arkinfer.pipeline.verify import parity_metrics

    class Fixed:  # a runtime that cannot be re-run layer by layer (llama.cpp, onnxruntime)
        def __init__(self, value: float) -> None:
            self.value = value

        def window_logits(self, ids):
            logits = torch.zeros(len(ids), 8)
            logits[-1, 0] = self.value
            return logits

    with pytest.raises(NonFiniteError, match="the artifact's runner"):
        parity_metrics(Fixed(0.0), Fixed(float("nan")), [[1, 2, 3]])


# --------------------------------------------------- 5: one value must not run away or mislead
@pytest.mark.parametrize("args,needles", [
    (["--max-windows", "-1"], ["--max-windows -1"]),
    (["--max-windows", "0"], ["--max-windows 0"]),
    (["--ctx", "1000000000"], ["--ctx 1000000000", "max_position_embeddings=4096"]),
    (["--text", "."], ["is a directory", "text file"]),
])
def test_eval_refuses_bad_windows(args, needles):
    base = {"--text": EVAL_TEXT, "--ctx": "64"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    res = invoke("eval", "demo", *[x for kv in base.items() for x in kv])
    assert_clean_error(res, *needles)


def test_eval_window_must_fit_in_memory(monkeypatch):
    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("M", (), {"available": 1 << 20}))
    res = invoke("eval", "demo", "--text", EVAL_TEXT, "--ctx", "512")
    assert_clean_error(res, "--ctx 512", "GiB available")


@pytest.mark.parametrize("args,needles", [
    (["--top-p", "0"], ["--top-p 0.0", "(0, 1]"]), (["--top-p", "nan"], ["--top-p nan"]),
    (["--temperature", "-1"], ["--temperature -1.0"]),
    (["--temperature", "nan"], ["--temperature nan"])])
def test_run_refuses_bad_sampling_settings(args, needles):
    assert_clean_error(invoke("run", "demo", "-p", "hi", "-n", "2", *args), *needles)


def test_bench_refuses_zero_threads(artifact):
    assert_clean_error(invoke("bench", artifact, "--threads", "0"), "--threads 0", "at least 1")
    # the old spelling still works for one release, with a deprecation line
    res = invoke("bench", artifact, "-t", "0")
    assert "deprecated: `bench -t N` is now --threads N" in res.output
    assert_clean_error(res, "--threads 0", "at least 1")


def test_calibration_seq_len_is_checked_before_allocating(tmp_path):
    t0 = time.time()
    res = invoke("quantize", "demo", "--preset", "q4_0", "--seq-len", "1000000000",
                 "-o", tmp_path / "q")
    assert_clean_error(res, "--seq-len 1000000000", "max_position_embeddings=4096")
    assert time.time() - t0 < 60


def test_calibration_memory_is_checked_before_allocating():
    from arkinfer.quant import QuantError
    from arkinfer.quant.calib_data import check_calibration_size

    with pytest.raises(QuantError, match="--samples 1000000000 x --seq-len 4096"):
        check_calibration_size(10**9, 4096, max_positions=4096, hidden_size=128)


# ----------------------------------------------------------- 6: resume checks its work files
def test_resume_refuses_a_corrupted_work_file(tiny_checkpoint, tmp_path):
    from arkinfer.quant import QuantError, QuantRecipe
    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.calib_data import calibration_from_ids

    folder = tiny_checkpoint("llama", num_hidden_layers=3)
    recipe = QuantRecipe("rtn", "gptq", 4, 64)
    calib = calibration_from_ids(torch.randint(0, 256, (2, 16),
                                               generator=torch.Generator().manual_seed(0)))

    def stop_after_block_1(layer, n_layers, seconds):
        if layer == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        calibrate(folder, recipe, calib, tmp_path / "w", progress=stop_after_block_1)
    block = tmp_path / "w" / "block_0000.safetensors"
    data = bytearray(block.read_bytes())
    data[-1] ^= 0x40  # an exponent bit of the last value
    block.write_bytes(bytes(data))
    with pytest.raises(QuantError, match="block_0000.safetensors does not match the sha256") as exc:
        calibrate(folder, recipe, calib, tmp_path / "w", resume=True)
    assert "rerun without --resume" in exc.value.hint


# ---------------------------------------------------------- 8: usage errors in the same format
@pytest.mark.parametrize("args,needle", [
    (["build", "--no-such-option"], "No such option: --no-such-option"),
    (["verify"], "Missing argument"),
    (["eval", "demo", "--ctx", "many", "--text", EVAL_TEXT], "'--ctx'"),
    (["no-such-verb"], "No such command"),
])
def test_usage_errors_use_the_error_hint_format(args, needle):
    res = invoke(*args)
    assert_clean_error(res, needle, "Usage: arkinfer", "--help`", code=2)
    assert "╭" not in res.output  # not typer's boxed panel


# ------------------------------------------------------- 9: filesystem errors are not "bugs"
@pytest.mark.parametrize("out,needles", [
    ("/tmp/" + "x" * 300, ["File name too long", "shorter"]),
    ("/sys/arkinfer-out", ["/sys/", "not permitted"]),
])
def test_unwritable_output_names_the_path(out, needles):
    res = invoke("build", "demo", "--target", "host", "--backend", "reference", "--quant", "f32",
                 "-o", out)
    assert_clean_error(res, *needles)


@pytest.mark.parametrize("code,needles", [(errno.ENOSPC, ["No space left", "disk is full"]),
                                          (errno.EROFS, ["Read-only file system", "writable"])])
def test_disk_errors_name_the_path(monkeypatch, tmp_path, code, needles):
    from arkinfer.pipeline import artifact

    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code), str(tmp_path / "out" / "model.gguf"))

    monkeypatch.setattr(artifact, "verify_artifact", fail)
    res = invoke("verify", tmp_path, "--json")
    assert_clean_error(res, str(tmp_path / "out" / "model.gguf"), *needles)
