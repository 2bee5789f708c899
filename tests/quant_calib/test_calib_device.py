"""Calibration on a chosen device (`--device auto|cpu|cuda`, quant/calib/device.py).

On every machine: the device choice is resolved and refused the way a user needs (a CUDA request
without a GPU is one error before any work, naming what to do), and `device="cpu"` is the default
path bit for bit.

On a CUDA machine (benchmarks/calib_cuda_check.sh runs these there): GPTQ, P-GPTQ and AWQ on the
GPU against the same run on the CPU, for the demo model and a tiny Llama. Codes are not required
to be identical: float32 sums run in another order on the GPU (cuBLAS tiles, atomics in the
reductions), so a weight within float32 rounding of a rounding boundary can take the other code,
and GPTQ's error feedback carries that small difference to the columns after it and the next
block's inputs. Act-order makes this larger: columns are processed in the order of the Hessian's
diagonal, and two near-equal diagonal entries summed in another order can swap, so GPTQ visits
those columns in another order and picks other (equally good) codes for the rest of the row; AWQ's
discrete scale search can flip between near-equal losses. Measured on an H200 (BENCHMARKS.md,
"Calibration on a GPU"): 93-98 % of codes equal, block SNRs within 0.04 dB of the CPU's on the demo
and within 0.15 dB on the tiny random Llama (3 blocks, 2K tokens: one different choice moves its
SNR further), linear SNRs within 0.23 dB. The tolerance is therefore stated on quality, with
margin: the GPU's blocks no worse on average than the CPU's by more than 0.1 dB, no block further
than 0.25 dB from the CPU's, no linear further than 0.3 dB, at least 90 % of codes equal.
"""

from __future__ import annotations

import json

import pytest
import torch
from arkinfer.quant.calib.device import exact_float32, resolve_device
from arkinfer.quant.calib.stream import block_file, calibrate, load_info, load_weights
from arkinfer.quant.recipe import QuantRecipe
from arkinfer.quant.weight import QuantError
from typer.testing import CliRunner

from arkinfer.frontend.demo import demo_model_path

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU "
                                "(benchmarks/calib_cuda_check.sh runs these on one)")
no_cuda = pytest.mark.skipif(CUDA, reason="checks the refusal on a machine without CUDA")

# what `build` runs for each calibrated method (pipeline/build.py: act-order over static groups)
RECIPES = {
    "gptq": (QuantRecipe("gptq", "gptq", 4, 64, sym=True),
             {"act_order": True, "static_groups": True}),
    "pgptq": (QuantRecipe("pgptq", "gguf-q4_0", 4, 32, sym=True),
              {"act_order": True, "static_groups": True}),
    "awq": (QuantRecipe("awq", "awq", 4, 64, sym=False), None),
}
MIN_CODE_AGREEMENT = 0.90
MAX_LINEAR_SNR_DIFF_DB = 0.3
MAX_BLOCK_SNR_DIFF_DB = 0.25
MAX_MEAN_BLOCK_SNR_LOSS_DB = 0.1


# ------------------------------------------------------------------------ everywhere
def test_auto_and_cpu_resolve():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == (torch.device("cuda", 0) if CUDA else torch.device("cpu"))
    assert resolve_device(None) == resolve_device("auto")


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "tpu", "cuda:-"])
def test_unknown_device_is_refused(bad):
    with pytest.raises(QuantError) as exc:
        resolve_device(bad)
    assert bad in exc.value.message and "cuda" in exc.value.hint


@no_cuda
@pytest.mark.parametrize("choice", ["cuda", "cuda:0", "CUDA"])
def test_cuda_without_a_gpu_is_one_clear_error(choice):
    with pytest.raises(QuantError) as exc:
        resolve_device(choice)
    assert "sees no CUDA GPU" in exc.value.message and torch.__version__ in exc.value.message
    assert "--device cpu" in exc.value.hint


def test_cuda_index_out_of_range_is_refused():
    with pytest.raises(QuantError) as exc:
        resolve_device(f"cuda:{torch.cuda.device_count() + 3}")
    assert "cuda" in exc.value.message


def test_exact_float32_is_a_no_op_on_cpu():
    before = torch.backends.cuda.matmul.allow_tf32
    with exact_float32(torch.device("cpu")):
        assert torch.backends.cuda.matmul.allow_tf32 == before


@no_cuda
def test_calibrate_refuses_cuda_before_writing(tiny_checkpoint, calib_ids, tmp_path):
    folder = tiny_checkpoint("llama", num_hidden_layers=2)
    with pytest.raises(QuantError, match="sees no CUDA GPU"):
        calibrate(folder, RECIPES["gptq"][0], calib_ids(2, 16), tmp_path / "work", device="cuda")
    assert not (tmp_path / "work").exists()


def test_cpu_device_is_the_default_path(tiny_checkpoint, calib_ids, tmp_path):
    folder = tiny_checkpoint("llama", num_hidden_layers=2)
    recipe, options = RECIPES["gptq"]
    calib = calib_ids(4, 16)
    default = calibrate(folder, recipe, calib, tmp_path / "a", options=options)
    explicit = calibrate(folder, recipe, calib, tmp_path / "b", options=options, device="cpu")
    assert default.device == explicit.device == "cpu"
    for i in range(2):
        a, _, _ = load_weights(block_file(tmp_path / "a", i))
        b, _, _ = load_weights(block_file(tmp_path / "b", i))
        assert set(a) == set(b) and all(a[n].equals(b[n]) for n in a)
        assert "gpu_peak_bytes" not in load_info(block_file(tmp_path / "a", i))


@no_cuda
@pytest.mark.parametrize("command", [["quantize", "demo", "--preset", "gptq", "-o", "OUT"],
                                     ["build", "demo", "--quant", "gptq", "-o", "OUT"]])
def test_cli_refuses_cuda_without_a_gpu(command, tmp_path):
    from arkinfer.cli.main import app

    out = tmp_path / "out"
    args = [str(out) if a == "OUT" else a for a in command] + ["--device", "cuda"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert "sees no CUDA GPU" in result.output and "--device cpu" in result.output
    assert not out.exists()


# ------------------------------------------------------------------------ on a CUDA GPU
def _agreement(dir_cpu, dir_gpu, n_layers: int) -> dict:
    """Code agreement and SNR differences between two runs' work folders."""
    same = total = 0
    worst_linear, worst_block, gain = 0.0, 0.0, 0.0
    for i in range(n_layers):
        a, _, info_a = load_weights(block_file(dir_cpu, i))
        b, _, info_b = load_weights(block_file(dir_gpu, i))
        assert set(a) == set(b)
        for name in a:
            same += int((a[name].codes == b[name].codes).sum())
            total += a[name].codes.numel()
        snr_a = {r["name"]: r["snr_db"] for r in info_a["linears"]}
        for r in info_b["linears"]:
            if r["snr_db"] is not None and snr_a[r["name"]] is not None:
                worst_linear = max(worst_linear, abs(r["snr_db"] - snr_a[r["name"]]))
        worst_block = max(worst_block, abs(info_a["block_snr_db"] - info_b["block_snr_db"]))
        gain += (info_b["block_snr_db"] - info_a["block_snr_db"]) / n_layers
        assert info_b["gpu_peak_bytes"] > 0
    return {"code_agreement": same / total, "max_linear_snr_diff_db": worst_linear,
            "max_block_snr_diff_db": worst_block, "mean_block_snr_gain_db": gain}


def _model_and_calibration(model: str, tiny_checkpoint, calib_ids):
    """The demo with 16 windows of 128 tokens of the built-in corpus, or a tiny Llama (no
    tokenizer) with 16 x 128 random ids."""
    from arkinfer.quant.calib_data import calibration_of

    from arkinfer.frontend.checkpoint import open_checkpoint

    if model == "demo":
        folder = demo_model_path()
        return folder, calibration_of(open_checkpoint(folder), None, 16, 128, 0)
    return tiny_checkpoint("llama", num_hidden_layers=3), calib_ids(16, 128)


@needs_cuda
@pytest.mark.parametrize("method", sorted(RECIPES))
@pytest.mark.parametrize("model", ["demo", "tiny-llama"])
def test_gpu_codes_agree_with_cpu(method, model, tiny_checkpoint, calib_ids, tmp_path):
    folder, calib = _model_and_calibration(model, tiny_checkpoint, calib_ids)
    recipe, options = RECIPES[method]
    cpu = calibrate(folder, recipe, calib, tmp_path / "cpu", options=options, device="cpu")
    gpu = calibrate(folder, recipe, calib, tmp_path / "gpu", options=options, device="cuda")
    assert gpu.device.startswith("cuda:0")
    got = _agreement(tmp_path / "cpu", tmp_path / "gpu", cpu.n_layers)
    print(f"\n{model} {method}: " + json.dumps({k: round(v, 5) for k, v in got.items()}))
    assert got["code_agreement"] >= MIN_CODE_AGREEMENT, got
    assert got["max_linear_snr_diff_db"] <= MAX_LINEAR_SNR_DIFF_DB, got
    assert got["max_block_snr_diff_db"] <= MAX_BLOCK_SNR_DIFF_DB, got
    assert got["mean_block_snr_gain_db"] >= -MAX_MEAN_BLOCK_SNR_LOSS_DB, got
    if cpu.tail is not None and cpu.tail.get("snr_db") is not None:
        assert abs(cpu.tail["snr_db"] - gpu.tail["snr_db"]) <= MAX_LINEAR_SNR_DIFF_DB
