"""Layer streaming equals a whole-model run, resumes to identical bytes, and holds one block."""

from __future__ import annotations

import filecmp

import pytest
import torch
from arkinfer.quant import QuantRecipe, get_format
from arkinfer.quant.calib import BlockRunner, CalibContext, config_for, handler_for
from arkinfer.quant.calib.stream import calibrate, load_weights
from arkinfer.quant.export import export_folder
from arkinfer.quant.load import load_quantized

from arkinfer.frontend.checkpoint import load_model, open_checkpoint


def whole_model_run(folder, recipe, calib, batch):
    """The non-streaming way: the full float model in memory, quantised in place block by block."""
    model = load_model(open_checkpoint(folder, with_tokenizer=False))
    cfg = model.config
    handler = handler_for(config_for(recipe))
    ctx = CalibContext(get_format(recipe.format))
    rope = cfg.inv_freq(calib.seq_len)
    with torch.no_grad():
        x = model.model.embed_tokens(calib.ids) * cfg.embedding_scale
        quantized = {}
        for i, layer in enumerate(model.model.layers):
            runner = BlockRunner(layer, f"model.layers.{i}.", x, calib.mask, rope, batch)
            quantized.update(handler.quantize_block(runner, ctx).quantized)
            x = runner.run()
    return model, quantized


@pytest.mark.parametrize("model_type,calib_name", [("llama", "gptq"), ("minicpm", "awq")])
def test_streaming_equals_whole_model(tiny_checkpoint, calib_ids, tmp_path, model_type,
                                      calib_name):
    folder = tiny_checkpoint(model_type, num_hidden_layers=3)
    recipe = QuantRecipe(calib_name, calib_name, 4, 64, sym=calib_name == "gptq",
                         desc_act=calib_name == "gptq")
    calib = calib_ids(6, 24)
    model, quantized = whole_model_run(folder, recipe, calib, batch=4)
    run = calibrate(folder, recipe, calib, tmp_path / "work", batch=4)
    streamed = {}
    for i in range(3):
        streamed.update(load_weights(tmp_path / "work" / f"block_{i:04d}.safetensors")[0])
    assert set(streamed) == set(quantized) and len(streamed) == 21
    for name, qw in quantized.items():
        assert streamed[name].equals(qw), name
    # the exported folder loads back to the whole-model run's weights, norms included
    out = export_folder(run, tmp_path / "out")
    loaded = load_quantized(out).state_dict()
    for name, t in model.state_dict().items():
        assert torch.equal(loaded[name], t), name


def test_streaming_reads_bf16_shards(calib_ids, tmp_path):
    from arkinfer.testing.synthetic import write_checkpoint
    from arkinfer.models.configs import tiny_config

    bf16 = write_checkpoint(tmp_path / "bf16", tiny_config("minicpm", num_hidden_layers=2),
                            dtype=torch.bfloat16, shard_bytes=60_000)
    assert len(list(bf16.glob("*.safetensors"))) > 2
    run = calibrate(bf16, QuantRecipe("gptq", "gptq", 4, 128), calib_ids(4, 16), tmp_path / "w")
    out = export_folder(run, tmp_path / "out")
    sd = load_quantized(out).state_dict()
    assert sd["model.layers.1.input_layernorm.weight"].dtype == torch.float32


class Interrupt(Exception):
    pass


def interrupted_then_resumed(folder, recipe, calib, tmp_path, stop_after: int) -> list[int]:
    """Calibrate into w2, interrupted after block `stop_after`, then resume; check the result's
    files equal an uninterrupted run's and return the blocks the resume ran."""
    full = export_folder(calibrate(folder, recipe, calib, tmp_path / "w1"), tmp_path / "full")

    def stop(layer, n_layers, seconds):
        assert seconds >= 0
        if layer == stop_after:
            raise Interrupt

    with pytest.raises(Interrupt):
        calibrate(folder, recipe, calib, tmp_path / "w2", progress=stop)
    seen = []
    run = calibrate(folder, recipe, calib, tmp_path / "w2", resume=True,
                    progress=lambda i, n, s: seen.append(i))
    resumed = export_folder(run, tmp_path / "resumed")
    files = sorted(p.name for p in full.iterdir() if p.name != "quant_summary.json")
    assert files == sorted(p.name for p in resumed.iterdir() if p.name != "quant_summary.json")
    match, mismatch, errors = filecmp.cmpfiles(full, resumed, files, shallow=False)
    assert not mismatch and not errors and len(match) == len(files)
    return seen


@pytest.mark.parametrize("calib_name,fmt", [("gptq", "gptq"), ("awq", "awq")])
def test_resume_after_interruption_is_identical(tiny_checkpoint, calib_ids, tmp_path, calib_name,
                                                fmt):
    folder = tiny_checkpoint("llama", num_hidden_layers=4)
    recipe = QuantRecipe(calib_name, fmt, 4, 64, sym=calib_name != "awq")
    seen = interrupted_then_resumed(folder, recipe, calib_ids(6, 24), tmp_path, stop_after=1)
    assert seen == [2, 3]  # blocks 0 and 1 were not redone


def test_resume_from_an_earlier_checkpoint_is_identical(tiny_checkpoint, calib_ids, tmp_path,
                                                         monkeypatch):
    """When writing the next block's inputs is costly they are written less often; a resume then
    redoes the blocks after the last one written, with the same result."""
    from arkinfer.quant.calib import stream

    # every write counts as costly and the block work never reaches the ratio: the inputs are
    # written after block 0 (the first write measures the cost) and after the last block only
    monkeypatch.setattr(stream, "HIDDEN_SAVE_MIN_SECONDS", 0.0)
    monkeypatch.setattr(stream, "HIDDEN_SAVE_RATIO", 1e12)
    folder = tiny_checkpoint("llama", num_hidden_layers=4)
    recipe = QuantRecipe("gptq", "gptq", 4, 64, sym=True)
    seen = interrupted_then_resumed(folder, recipe, calib_ids(6, 24), tmp_path, stop_after=2)
    assert seen == [1, 2, 3]  # resumed after block 0, whose outputs were the last written


def test_resume_refuses_other_settings(tiny_checkpoint, calib_ids, tmp_path):
    from arkinfer.quant import QuantError

    folder = tiny_checkpoint("llama")
    calibrate(folder, QuantRecipe("rtn", "gptq", 4, 64), calib_ids(2, 16), tmp_path / "w")
    with pytest.raises(QuantError, match="different settings"):
        calibrate(folder, QuantRecipe("rtn", "gptq", 4, 32), calib_ids(2, 16), tmp_path / "w",
                  resume=True)
