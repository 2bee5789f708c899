"""Per-linear storage formats (`QuantRecipe.layers`, what mixed precision writes): the recipe
resolves each linear's format, GPTQ quantises each at its own bits, the folder records the table,
`quant.load` reads it, and the GGUF backend writes each tensor in its own ggml type — checked
against gguf-py's dequantiser and against llama.cpp running the file."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from arkinfer.backends.gguf.backend import BACKEND
from arkinfer.backends.gguf.runner import LlamaCppRunner
from arkinfer.quant import QuantRecipe
from arkinfer.quant.calib.stream import calibrate
from arkinfer.quant.calib_data import calibration_from_ids
from arkinfer.quant.export import export_folder
from arkinfer.quant.load import load_quantized
from arkinfer.quant.weight import QuantError
from gguf.quants import dequantize

from arkinfer.backend import LowerRequest
from arkinfer.frontend.demo import demo_model_path
from arkinfer.models.configs import tiny_config
from arkinfer.testing.synthetic import write_checkpoint

MIXED = QuantRecipe("gptq", "gguf-q4_0", 4, 32, skip=(),
                    layers=(("*.mlp.down_proj", "gguf-q8_0"), ("*.self_attn.v_proj", "gguf-q8_0"),
                            ("lm_head", "gguf-q8_0")))


def test_for_layer_resolves_the_first_matching_override():
    assert MIXED.for_layer("model.layers.0.mlp.down_proj").format == "gguf-q8_0"
    assert MIXED.for_layer("model.layers.0.mlp.down_proj").bits == 8
    assert MIXED.for_layer("model.layers.0.mlp.up_proj") is MIXED
    assert MIXED.for_layer("lm_head").format == "gguf-q8_0"
    assert "3 layer overrides" in MIXED.describe()


def test_an_override_takes_its_formats_own_symmetry():
    """Q4_1 / Q5_1 store each block's minimum: under a symmetric recipe they are asymmetric
    (a symmetric Q4_1 is Q4_0 at half a bit more); the recipe's own format keeps its symmetry."""
    recipe = QuantRecipe("gptq", "gguf-q4_0", 4, 32, sym=True, skip=(),
                         layers=(("*.down_proj", "gguf-q5_1"), ("*.up_proj", "gguf-q4_1"),
                                 ("*.gate_proj", "gguf-q8_0")))
    assert recipe.for_layer("model.layers.0.mlp.down_proj").sym is False
    assert recipe.for_layer("model.layers.0.mlp.down_proj").bits == 5
    assert recipe.for_layer("model.layers.0.mlp.up_proj").sym is False
    assert recipe.for_layer("model.layers.0.mlp.gate_proj").sym is True
    assert recipe.for_layer("model.layers.0.self_attn.q_proj").sym is True
    assert QuantRecipe("rtn", "gguf-q4_1", 4, 32, sym=True).sym is True  # asked for, allowed


def test_overrides_are_refused_where_they_cannot_be_stored():
    with pytest.raises(QuantError, match="per-layer formats"):
        QuantRecipe("gptq", "gptq", 4, 128, layers=(("*.down_proj", "gptq"),))
    with pytest.raises(QuantError, match="unknown storage format|not a"):
        QuantRecipe("gptq", "gguf-q4_0", 4, 32, layers=(("*.down_proj", "gguf-q9_9"),))
    with pytest.raises(QuantError, match="pair"):
        QuantRecipe("gptq", "gguf-q4_0", 4, 32, layers=("*.down_proj",))


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory) -> tuple[Path, Path]:
    demo = demo_model_path()
    extra = {n: (demo / n).read_text(encoding="utf-8")
             for n in ("tokenizer.json", "tokenizer_config.json")}
    root = tmp_path_factory.mktemp("mixed")
    src = write_checkpoint(root / "src", tiny_config("llama", vocab_size=2048,
                                                     tie_word_embeddings=True), extra_files=extra)
    ids = torch.randint(5, 2000, (4, 32), generator=torch.Generator().manual_seed(0))
    run = calibrate(src, MIXED, calibration_from_ids(ids), root / "q.work",
                    options={"act_order": True, "static_groups": True})
    return src, export_folder(run, root / "q")


def test_folder_records_each_linears_format_and_keeps_the_tie(mixed_folder):
    _, qdir = mixed_folder
    raw = json.loads((qdir / "config.json").read_text())
    assert raw["tie_word_embeddings"] is True  # the output layer is the embedding, stored once
    layers = raw["quantization_config"]["layers"]
    assert layers["model.embed_tokens"]["format"] == "gguf-q8_0"
    assert layers["model.layers.0.mlp.down_proj"] == {"format": "gguf-q8_0", "bits": 8,
                                                      "group_size": 32, "sym": True}
    assert "model.layers.0.mlp.up_proj" not in layers  # the folder's own gguf-q4_0
    summary = json.loads((qdir / "quant_summary.json").read_text())
    recipes = {r["name"]: r["recipe"] for b in summary["blocks"] for r in b["linears"]}
    assert "gguf-q8_0" in recipes["model.layers.1.self_attn.v_proj"]


def test_loaded_weights_equal_gguf_py_dequantisation_of_each_layers_bytes(mixed_folder):
    """`quant.load` unpacks every layer with its own format: equal to gguf-py's dequantiser of the
    stored bytes (an independent reading of the ggml block layouts)."""
    from safetensors import safe_open

    _, qdir = mixed_folder
    model = load_quantized(qdir)
    state = model.state_dict()
    index = json.loads((qdir / "model.safetensors.index.json").read_text())["weight_map"]
    types = {"down_proj": gguf.GGMLQuantizationType.Q8_0,
             "v_proj": gguf.GGMLQuantizationType.Q8_0,
             "up_proj": gguf.GGMLQuantizationType.Q4_0,
             "embed_tokens": gguf.GGMLQuantizationType.Q8_0}
    checked = 0
    for name, file in index.items():
        kind = name.split(".")[-2]
        if kind not in types:
            continue
        with safe_open(str(qdir / file), framework="numpy") as fh:
            blocks = fh.get_tensor(name)
        assert blocks.dtype == np.uint8, name
        expected = dequantize(blocks, types[kind])
        np.testing.assert_array_equal(state[name].numpy(), expected.reshape(state[name].shape))
        checked += 1
    assert checked == 2 * 3 + 1
    assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.llamacpp
def test_gguf_holds_each_layer_in_its_type_and_llamacpp_agrees(mixed_folder, tmp_path):
    src, qdir = mixed_folder
    BACKEND.lower(LowerRequest(qdir, src, MIXED, "f16", None, tmp_path, options={}))
    path = tmp_path / "model.gguf"
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.ffn_down.weight"] == types["blk.1.attn_v.weight"] == "Q8_0"
    assert types["blk.0.ffn_up.weight"] == types["blk.1.attn_q.weight"] == "Q4_0"
    assert types["token_embd.weight"] == "Q8_0"
    assert "output.weight" not in types  # tied: llama.cpp reads the output layer from token_embd
    ids = torch.randint(5, 2000, (80,), generator=torch.Generator().manual_seed(3)).tolist()
    ours = LlamaCppRunner(path, n_ctx=256, kv_type="f32").window_logits(ids)
    model = load_quantized(qdir)
    with torch.no_grad():
        ref, _ = model(torch.tensor([ids]), torch.arange(len(ids)), model.empty_cache(1))
    ref = ref[0]
    # llama.cpp rounds activations to 8 bits inside quantised matmuls: close, not equal
    assert (ours - ref).abs().max().item() < 0.1 * ref.abs().max().item()
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.95
