"""Asymmetric GPTQ (`GPTQConfig.asymmetric`, quant/calib/gptq.py `asymmetric_target`): the
target is the least-squares weight for the float model's outputs from the quantised model's
inputs, checked against torch.linalg.lstsq, and the calibration that carries both paths."""

from __future__ import annotations

import filecmp

import pytest
import torch
from arkinfer.quant import QuantError, QuantRecipe
from arkinfer.quant.calib.gptq import asymmetric_correction, asymmetric_target
from arkinfer.quant.calib.hessian import CrossAccumulator, HessianAccumulator
from arkinfer.quant.calib.stream import calibrate, load_weights
from arkinfer.quant.export import export_folder
from arkinfer.quant.load import load_quantized

from arkinfer.frontend.checkpoint import load

RECIPE = QuantRecipe("gptq", "gptq", 4, 32, sym=True, desc_act=True)


def test_target_is_the_least_squares_weight():
    gen = torch.Generator().manual_seed(0)
    x_float = torch.randn(400, 24, generator=gen)
    x_quant = x_float + 0.1 * torch.randn(400, 24, generator=gen)
    w = torch.randn(7, 24, generator=gen)
    h, cross = HessianAccumulator(24), CrossAccumulator(24)
    h.add(x_quant)
    cross.add(x_float, x_quant)
    target = asymmetric_target(w, asymmetric_correction(h.hessian(), cross.matrix(), damp=0.0))
    # argmin_W' ||x_float W^T - x_quant W'^T||
    expected = torch.linalg.lstsq(x_quant.double(), (x_float @ w.T).double()).solution.T
    assert torch.allclose(target.double(), expected, atol=1e-4)
    # equal inputs on both paths: the target is the weight itself, whatever the damping
    assert torch.equal(asymmetric_target(w, asymmetric_correction(h.hessian(), h.hessian(), 0.01)), w)


def test_cross_accumulator_masks_and_refuses_unpaired_inputs():
    a, b = torch.randn(2, 5, 3), torch.randn(2, 5, 3)
    keep = torch.zeros(2, 5, dtype=torch.bool)
    keep[0, :2] = True
    acc = CrossAccumulator(3)
    acc.add(a, b, keep)
    assert acc.count == 2
    expected = 2 / 2 * a[0, :2].T.double() @ b[0, :2].double()
    assert torch.allclose(acc.matrix().double(), expected, atol=1e-6)
    with pytest.raises(QuantError, match="do not pair up"):
        acc.add(a, b[:, :4])


def _logit_error(folder, quantised, calib) -> float:
    """Mean squared error of the logits on the calibration tokens against the float model."""
    from arkinfer.generate import model_logits_fn

    reference = model_logits_fn(load(folder)[1])
    got = model_logits_fn(quantised)
    with torch.no_grad():
        return sum(float(((reference(row) - got(row)) ** 2).mean()) for row in calib.ids.tolist())


def test_asymmetric_calibration_runs_both_paths_and_lowers_output_error(tiny_checkpoint, calib_ids,
                                                                         tmp_path):
    folder = tiny_checkpoint("llama", num_hidden_layers=4, hidden_size=64, intermediate_size=128)
    calib = calib_ids(16, 32)
    plain = calibrate(folder, RECIPE, calib, tmp_path / "w_plain",
                      options={"static_groups": True})
    asym = calibrate(folder, RECIPE, calib, tmp_path / "w_asym",
                     options={"static_groups": True, "asymmetric": True})
    assert "asymmetric" in asym.blocks[0]["linears"][0]["recipe"]
    # block 0's q/k/v read the embedding on both paths: same target, same codes
    q_plain = load_weights(tmp_path / "w_plain" / "block_0000.safetensors")[0]
    q_asym = load_weights(tmp_path / "w_asym" / "block_0000.safetensors")[0]
    for name in ("q_proj", "k_proj", "v_proj"):
        full = f"model.layers.0.self_attn.{name}"
        assert torch.equal(q_plain[full].codes, q_asym[full].codes), name
    assert not torch.equal(q_plain["model.layers.0.mlp.down_proj"].codes,
                           q_asym["model.layers.0.mlp.down_proj"].codes)
    err_plain = _logit_error(folder, load_quantized(export_folder(plain, tmp_path / "plain")),
                              calib)
    err_asym = _logit_error(folder, load_quantized(export_folder(asym, tmp_path / "asym")), calib)
    assert err_asym < err_plain


def test_asymmetric_resume_is_identical(tiny_checkpoint, calib_ids, tmp_path):
    """The float model's hidden states are saved beside the quantised one's, so a resumed run
    equals an uninterrupted one."""
    folder = tiny_checkpoint("llama", num_hidden_layers=3)
    calib = calib_ids(6, 24)
    options = {"static_groups": True, "asymmetric": True}
    full = export_folder(calibrate(folder, RECIPE, calib, tmp_path / "w1", options=options),
                         tmp_path / "full")

    class Stop(Exception):
        pass

    def stop(layer, n_layers, seconds):
        if layer == 1:
            raise Stop

    with pytest.raises(Stop):
        calibrate(folder, RECIPE, calib, tmp_path / "w2", options=options, progress=stop)
    seen: list[int] = []
    run = calibrate(folder, RECIPE, calib, tmp_path / "w2", options=options, resume=True,
                    progress=lambda i, n, s: seen.append(i))
    resumed = export_folder(run, tmp_path / "resumed")
    assert seen == [2]
    files = sorted(p.name for p in full.iterdir() if p.name != "quant_summary.json")
    match, mismatch, errors = filecmp.cmpfiles(full, resumed, files, shallow=False)
    assert not mismatch and not errors and len(match) == len(files)


def test_asymmetric_refuses_the_prefix_treatment(tiny_checkpoint, calib_ids, tmp_path):
    folder = tiny_checkpoint("llama", num_hidden_layers=2)
    recipe = QuantRecipe("pgptq", "gptq", 4, 32, sym=True)
    with pytest.raises(QuantError, match="asymmetric GPTQ needs"):
        calibrate(folder, recipe, calib_ids(4, 16), tmp_path / "w", options={"asymmetric": True})
