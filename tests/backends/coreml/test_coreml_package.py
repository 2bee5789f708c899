"""A tiny MiniCPM (InfLLM v2 on) and a tiny Llama, RTN-quantised to GPTQ (int4, symmetric) and
AWQ (uint4 + offset) folders, lowered to Core ML packages; then what Linux can check honestly:

- the saved package, reloaded, holds every quantised linear's canonical codes and scales;
- its op set is iOS 18's; it has prefill and decode functions and the KV cache as state;
- the saved program, run by the MIL evaluator, agrees with ArkInfer's reference model on the
  same (dequantised) weights, through the sparse InfLLM v2 path, and decode continues prefill;
- on macOS (only there) Core ML's own prediction agrees with the evaluator.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ct = pytest.importorskip("coremltools")

from arkinfer.backend import LowerRequest  # noqa: E402
from arkinfer.backends.coreml.backend import BACKEND  # noqa: E402
from arkinfer.backends.coreml.runner import PACKAGE, CoreMLRunner  # noqa: E402
from arkinfer.backends.coreml.verify import opset_check, weight_check  # noqa: E402
from arkinfer.backends.coreml.weights import SourceWeights  # noqa: E402
from arkinfer.frontend.checkpoint import open_checkpoint  # noqa: E402
from arkinfer.quant import QuantRecipe  # noqa: E402
from arkinfer.quant.load import load_quantized  # noqa: E402

SPARSE = {"kernel_size": 32, "kernel_stride": 16, "block_size": 64, "init_blocks": 1,
          "window_size": 64, "topk": 2, "use_nope": False, "dense_len": 128}
CONTEXT = 256


def _quantise(folder: Path, recipe: QuantRecipe, work: Path) -> Path:
    from arkinfer.quant.calib.weight_only import quantize_weight_only
    from arkinfer.quant.export import export_folder

    run = quantize_weight_only(open_checkpoint(folder), recipe, work / "calib")
    return export_folder(run, work / "quantised")


@pytest.fixture(scope="module", params=[
    ("minicpm", QuantRecipe("rtn", "gptq", 4, 64, sym=True)),
    ("llama", QuantRecipe("rtn", "awq", 4, 32, sym=False))], ids=["minicpm-gptq", "llama-awq"])
def package(request, tiny_checkpoint, tmp_path_factory):
    model_type, recipe = request.param
    extra = {"sparse_config": SPARSE} if model_type == "minicpm" else {}
    src = tiny_checkpoint(model_type, num_hidden_layers=1, **extra)
    work = tmp_path_factory.mktemp(f"coreml-{model_type}")
    quantised = _quantise(src, recipe, work)
    out = work / "artifact"
    result = BACKEND.lower(LowerRequest(quantised, src, recipe, "f32", None, out,
                                        options={"context": str(CONTEXT)}))
    return out, quantised, result


def test_package_holds_the_canonical_codes(package):
    out, quantised, result = package
    program = _program(quantised)
    check = weight_check(out / PACKAGE, SourceWeights(quantised), program)
    assert check["passed"], check["problems"]
    assert check["checked"] == 2 * 7  # 7 linears of one layer, in prefill and in decode
    assert check["functions"] == ["decode", "prefill"]
    recorded = json.loads((out / "coreml_checks.json").read_text())
    assert recorded["passed"] and recorded["runtime_parity"] == "deferred to macOS"
    assert any("deferred to macOS" in n for n in result.notes)
    assert all(v.startswith("constexpr_blockwise_shift_scale") for v in result.layers.values())


def test_op_set_is_ios18_with_state(package):
    out, _, _ = package
    check = opset_check(out / PACKAGE)
    assert check["passed"], check["outside_ios18"]
    assert check["state_shape"][2] == CONTEXT
    assert "constexpr_blockwise_shift_scale" in check["ops"]
    assert "read_state" in check["ops"] and "coreml_update_state" in check["ops"]


def test_program_matches_the_reference_on_the_same_weights(package):
    out, quantised, _ = package
    runner = CoreMLRunner(out)
    model = load_quantized(quantised)
    ids = [int(i) for i in torch.randint(3, 500, (200,), generator=torch.Generator().manual_seed(0))]
    got = runner.window_logits(ids)  # 200 > dense_len = 128: InfLLM v2 selects blocks
    with torch.no_grad():
        want, _ = model(torch.tensor([ids]), torch.arange(len(ids)), model.empty_cache(1))
    want = want[0].float()
    top1 = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    assert top1 >= 0.98, top1
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    if not sys.platform == "darwin":
        assert runner.deferred and "deferred to macOS" in runner.deferred[0]


def test_decode_continues_prefill(package):
    out, _, _ = package
    runner = CoreMLRunner(out)
    ids = list(range(10, 150))
    full = runner.window_logits(ids)
    runner.reset()
    runner.prefill(ids[:-2])
    step1, step2 = runner.decode(ids[-2]), runner.decode(ids[-1])
    torch.testing.assert_close(step1, full[-2], atol=2e-2, rtol=0)
    torch.testing.assert_close(step2, full[-1], atol=2e-2, rtol=0)


@pytest.mark.skipif(sys.platform != "darwin", reason="Core ML prediction is macOS-only")
def test_coreml_prediction_matches_the_evaluator_on_macos(package):
    from arkinfer.backends.coreml.evaluate import MilEvaluator, load_functions

    out, _, _ = package
    runner = CoreMLRunner(out)  # Core ML itself on macOS
    ids = list(range(10, 150))
    got = runner.window_logits(ids).numpy()
    ev = MilEvaluator(load_functions(out / PACKAGE)["prefill"])
    want = ev.run({"tokens": np.array([ids], np.int32), "start": np.array([0], np.int32)})
    want = want["logits"][0]
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.98
    np.testing.assert_allclose(got, want, atol=0.05 * np.abs(want).max())


def _program(folder: Path):
    from arkinfer import ir

    raw = open_checkpoint(folder, with_tokenizer=False).raw_config
    return ir.trace(raw, dtype=torch.float32, shape_only=True, entries=("prefill",))
