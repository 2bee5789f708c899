"""The three grids of quant/rtn.py: `ggml` against llama.cpp's own Q4_0 reference quantiser
(gguf-py), `mse` never worse than the grid it starts from, and the recipe field."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arkinfer.quant import QuantError, QuantRecipe
from arkinfer.quant import rtn
from arkinfer.quant.rtn import find_params, quantize_rtn


def _weights(rows: int = 256, cols: int = 512, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen) * 0.02
    w[:, 5] *= 10  # outlier columns, as trained weights have
    w[3] = 0  # a dead row
    return w


def test_ggml_grid_gives_llama_cpps_q4_0_codes_and_scales():
    gguf = pytest.importorskip("gguf")
    w = _weights()
    ours = quantize_rtn(w, 4, 32, sym=True, grid="ggml")
    raw = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_0)
    blocks = raw.reshape(-1, 18)
    d = blocks[:, :2].copy().view(np.float16)[:, 0].astype(np.float32)
    packed = blocks[:, 2:]
    codes = np.concatenate([packed & 15, packed >> 4], axis=1).reshape(w.shape)
    live = np.abs(d) > 0  # ggml stores d = 0 for a dead block; ours keeps a finite scale
    ours_scales = ours.scales.reshape(-1).numpy()
    np.testing.assert_allclose(ours_scales[live].astype(np.float16).astype(np.float32), d[live])
    same = ours.codes.numpy() == codes
    assert same.mean() > 0.9999, f"{(~same).sum()} codes differ (only exact .5 ties may)"
    assert ours.dequantize()[3].abs().max() == 0


@pytest.mark.parametrize("sym", [True, False])
def test_mse_grid_is_never_worse_than_where_it_starts(sym):
    w = _weights(seed=1).reshape(-1, 32)
    importance = torch.rand(32, generator=torch.Generator().manual_seed(2)) + 0.1
    start = "ggml" if sym else "minmax"

    def err(grid: str) -> torch.Tensor:
        s, z = find_params(w, 4, sym, None, grid, importance)
        q = torch.clamp(torch.round(w / s) + z, 0, 15)
        return (importance * (w - s * (q - z)) ** 2).sum(dim=1)

    searched, base = err("mse"), err(start)
    assert bool((searched <= base * (1 + 1e-5) + 1e-12).all())
    assert float(searched.sum()) < 0.95 * float(base.sum())


def test_the_16_level_grid_beats_gptqs_15_level_reference():
    w = _weights(seed=3)
    errors = {g: float(((quantize_rtn(w, 4, 32, True, grid=g).dequantize() - w) ** 2).sum())
              for g in ("minmax", "ggml", "mse")}
    assert errors["mse"] < errors["ggml"] < errors["minmax"]


def test_negative_scales_round_trip_through_the_sym_formats():
    from arkinfer.quant import get_format

    w = _weights(rows=64, cols=256, seed=4)
    qw = quantize_rtn(w, 4, 128, True, scale_dtype=torch.float16, grid="mse")
    assert bool((qw.scales < 0).any())
    for name in ("gptq", "marlin"):
        fmt = get_format(name)
        back = fmt.dequantize(fmt.pack(qw), 64, 256, bits=4, group_size=128, sym=True)
        assert np.array_equal(back, qw.dequantize().numpy()), name


def test_recipe_names_the_grid_and_refuses_an_unknown_one():
    assert QuantRecipe("gptq", "gptq").grid == "mse"  # the default: searched scales
    assert "minmax-grid" in QuantRecipe("gptq", "gptq", grid="minmax").describe()
    with pytest.raises(QuantError, match="grid='fine'"):
        QuantRecipe("gptq", "gptq", grid="fine")


def test_quantize_cli_takes_the_grid_and_records_it(tmp_path):
    import json

    from typer.testing import CliRunner

    from arkinfer.cli.main import app

    res = CliRunner().invoke(app, ["quantize", "demo", "--method", "rtn", "--format", "gptq",
                                   "--grid", "ggml", "-o", str(tmp_path / "q"), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "q" / "quant_summary.json").read_text())
    assert "ggml-grid" in summary["recipe"]
    bad = CliRunner().invoke(app, ["quantize", "demo", "--grid", "fine", "-o", str(tmp_path / "r")])
    assert bad.exit_code == 2 and "fine" in bad.output


@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "importance"])
def test_the_scale_search_in_row_chunks_is_the_search_in_one_piece(monkeypatch, sym, weighted):
    """The mse grid searches SEARCH_ROWS groups at a time (faster: its temporaries stay in
    cache); every group's search is independent, so codes, scales and zeros are the same bits."""
    w = torch.randn(700, 256, generator=torch.Generator().manual_seed(3)) * 0.02
    importance = torch.rand(256, generator=torch.Generator().manual_seed(4)) if weighted else None
    monkeypatch.setattr(rtn, "SEARCH_ROWS", 10**9)
    whole = rtn.quantize_rtn(w, 4, 32, sym, grid="mse", importance=importance)
    monkeypatch.setattr(rtn, "SEARCH_ROWS", 1000)   # 700 x 8 = 5600 groups: 6 chunks
    chunked = rtn.quantize_rtn(w, 4, 32, sym, grid="mse", importance=importance)
    for field in ("codes", "scales", "zeros"):
        assert torch.equal(getattr(whole, field), getattr(chunked, field)), field
