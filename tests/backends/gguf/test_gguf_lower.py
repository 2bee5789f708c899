"""GGUF backend on tiny checkpoints: llama.cpp (llama-cpp-python) loads our files and its logits
equal the reference model's; quantised folders keep their exact block bytes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("llama_cpp", reason="llama-cpp-python (the [gguf] extra) is not installed")

from arkinfer.backends.gguf.backend import BACKEND
from arkinfer.backends.gguf.runner import LlamaCppRunner
from arkinfer.quant import QuantRecipe, get_preset
from arkinfer.quant.calib.stream import calibrate
from arkinfer.quant.calib_data import calibration_from_ids
from arkinfer.quant.export import export_folder
from arkinfer.quant.load import load_quantized

from arkinfer.backend import LowerRequest, Runner
from arkinfer.errors import ArkError
from arkinfer.frontend.demo import demo_model_path
from arkinfer.frontend.gguf_model import permute_qk
from arkinfer.models.configs import tiny_config
from arkinfer.pipeline.reference_runner import ReferenceRunner
from arkinfer.testing.synthetic import write_checkpoint

pytestmark = pytest.mark.llamacpp
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """checkpoint(model_type, **overrides) -> tiny HF folder with the demo tokenizer (2048 ids)."""
    demo = demo_model_path()
    extra = {n: (demo / n).read_text(encoding="utf-8") for n in TOKENIZER_FILES}
    made: dict[str, Path] = {}

    def make(model_type: str, **overrides) -> Path:
        key = repr((model_type, sorted(overrides.items())))
        if key not in made:
            folder = tmp_path_factory.mktemp(f"tiny-{model_type}")
            cfg = tiny_config(model_type, vocab_size=2048, **overrides)
            made[key] = write_checkpoint(folder, cfg, extra_files=extra)
        return made[key]

    return make


def lower(model_dir: Path, out: Path, recipe=None, dtype="f32", source=None, **options):
    request = LowerRequest(model_dir, source or model_dir, recipe, dtype, None, out,
                           options=options)
    return BACKEND.lower(request)


def random_ids(n: int, seed: int = 0) -> list[int]:
    return torch.randint(5, 2000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def longrope_256(model_type):
    """MiniCPM with LongRoPE whose original context (256) llama.cpp's n_ctx can sit on either side
    of (llama.cpp pads n_ctx to a multiple of 256 and picks factors by it); max 2048 makes the
    LongRoPE attention factor sqrt(1 + ln 8 / ln 256) = 1.17, written as rope.scaling.attn_factor."""
    cfg = tiny_config(model_type)
    scaling = dict(cfg["rope_scaling"], original_max_position_embeddings=256)
    return {"rope_scaling": scaling}


CASES = {
    "minicpm-short-factors": ("minicpm", longrope_256("minicpm"), 256, 120),
    "minicpm-long-factors": ("minicpm", longrope_256("minicpm"), 512, 300),
    "llama": ("llama", {}, 256, 120),
    "llama-tied": ("llama", {"tie_word_embeddings": True}, 256, 120),
    "llama3-rope": ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 64}}, 256, 120),
    "mistral": ("mistral", {}, 256, 120),
    "qwen2": ("qwen2", {}, 256, 120),
    "qwen3": ("qwen3", {}, 256, 120),
}


@pytest.mark.parametrize("case", list(CASES))
def test_f32_logits_equal_reference(checkpoint, tmp_path, case):
    """Scales, RoPE (incl. LongRoPE factors and attention factor), the q/k permutation, GQA,
    biases, q/k norms and tied embeddings are right: llama.cpp == reference within 1e-3."""
    model_type, overrides, n_ctx, length = CASES[case]
    folder = checkpoint(model_type, **overrides)
    result = lower(folder, tmp_path)
    assert result.files == ["model.gguf"]
    runner = LlamaCppRunner(tmp_path / "model.gguf", n_ctx=n_ctx, kv_type="f32")
    ids = random_ids(length)
    ours = runner.window_logits(ids)
    ref = ReferenceRunner(folder).window_logits(ids)
    assert ours.shape == ref.shape == (length, 2048)
    assert (ours - ref).abs().max().item() <= 1e-3


def test_demo_minicpm41_sparse_metadata_and_logits(tmp_path):
    """The shipped MiniCPM4.1-architecture demo (bf16, sparse_config): keys, ops, logits."""
    demo = demo_model_path()
    result = lower(demo, tmp_path, dtype="f32")
    assert "dense" in result.ops["attention"] and "arkinfer.sparse" in result.ops["attention"]
    reader = gguf.GGUFReader(tmp_path / "model.gguf")
    fields = {k: reader.fields[k].contents() for k in reader.fields if not k.startswith("GGUF.")}
    sparse = json.loads((demo / "config.json").read_text())["sparse_config"]
    for key, value in sparse.items():
        assert fields[f"arkinfer.sparse.{key}"] == value, key
    assert fields["general.architecture"] == "minicpm"
    assert fields["minicpm.embedding_scale"] == 12.0
    assert fields["minicpm.logit_scale"] == 128 / 32
    assert abs(fields["minicpm.residual_scale"] - 1.4 / 2) < 1e-7
    # both stop ids of generation_config.json: eos_token (<|im_end|>) and the other as EOT
    assert (fields["tokenizer.ggml.eos_token_id"], fields["tokenizer.ggml.eot_token_id"]) == (4, 2)
    assert "<|im_start|>" in fields["tokenizer.chat_template"]
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["rope_factors_long.weight"] == types["rope_factors_short.weight"] == "F32"
    runner = LlamaCppRunner(tmp_path / "model.gguf", n_ctx=512, kv_type="f32")
    ids = random_ids(200, seed=1)
    ours = runner.window_logits(ids)
    ref = ReferenceRunner(demo, dense=True).window_logits(ids)
    assert (ours - ref).abs().max().item() <= 1e-3
    # imported back (verify's quantised reference), the model keeps its sparse_config, so it runs
    # InfLLM v2 where the patched llama.cpp does
    from arkinfer.frontend.gguf_import import import_gguf

    import_gguf(tmp_path / "model.gguf", tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["sparse_config"] == sparse


def test_bf16_build_runs_close_to_reference(tmp_path):
    """BF16 weights are exact; llama.cpp's BF16 matmul also rounds activations to bf16."""
    demo = demo_model_path()
    lower(demo, tmp_path, dtype="bf16")
    types = {n: t.tensor_type.name for n, t in _gguf_tensors(tmp_path / "model.gguf").items()}
    assert types["blk.0.ffn_up.weight"] == "BF16" and types["blk.0.attn_norm.weight"] == "F32"
    runner = BACKEND.load(tmp_path, {"runner": {"n_ctx": 512}})
    ids = random_ids(200, seed=1)
    ours = runner.window_logits(ids)
    ref = ReferenceRunner(demo, dense=True).window_logits(ids)
    assert (ours - ref).abs().max().item() < 0.02 * ref.abs().max().item()
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.98


def test_runner_protocol_prefill_decode(checkpoint, tmp_path):
    folder = checkpoint("llama")
    lower(folder, tmp_path)
    runner = BACKEND.load(tmp_path, {"runner": {"n_ctx": 256}})
    assert isinstance(runner, Runner) and runner.vocab_size == 2048
    text = "<|im_start|>user\nHello world<|im_end|>\n"
    assert runner.tokenize(text) == ReferenceRunner(folder).tokenize(text)
    ids = random_ids(40, seed=2)
    full = runner.window_logits(ids)
    runner.reset()
    last = runner.prefill(ids[:30])
    steps = [runner.decode(t) for t in ids[30:]]
    assert torch.allclose(last, full[29], atol=1e-4)
    assert torch.allclose(torch.stack(steps), full[30:], atol=1e-3)
    runner.reset()
    assert torch.allclose(runner.prefill(ids[:30]), full[29], atol=1e-4)
    with pytest.raises(ArkError, match="exceed the context"):
        runner.prefill(random_ids(300))
    timing = BACKEND.load(tmp_path, {"runner": {"n_ctx": 256}}, bench=True)
    assert torch.allclose(timing.prefill(ids[:30]), full[29], atol=1e-4)
    assert torch.allclose(timing.decode(ids[30]), full[30], atol=1e-3)
    assert BACKEND.reference_weights(tmp_path) == tmp_path / "model.gguf"


# -- quantised folders ---------------------------------------------------------------------------

def quantise(folder: Path, recipe: QuantRecipe, out: Path) -> Path:
    ids = torch.randint(5, 2000, (2, 32), generator=torch.Generator().manual_seed(0))
    run = calibrate(folder, recipe, calibration_from_ids(ids), out.with_name(out.name + ".work"))
    return export_folder(run, out)


def _gguf_tensors(path: Path) -> dict[str, object]:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def _assert_blocks_copied(qdir: Path, gguf_path: Path, heads: dict[str, int]) -> int:
    """Every packed linear of `qdir` is in the GGUF byte for byte (q/k rows permuted)."""
    from arkinfer.backends.gguf.tensors import gguf_name
    from safetensors import safe_open

    tensors = _gguf_tensors(gguf_path)
    checked = 0
    index = json.loads((qdir / "model.safetensors.index.json").read_text())["weight_map"]
    for name, file in index.items():
        with safe_open(str(qdir / file), framework="numpy") as fh:
            blocks = fh.get_tensor(name)
        if blocks.dtype != np.uint8:
            continue
        kind = name.split(".")[-2]
        expected = permute_qk(blocks, heads[kind]) if kind in heads else blocks
        t = tensors[gguf_name(name)]
        assert np.array_equal(np.asarray(t.data).reshape(expected.shape), expected), name
        checked += 1
    return checked


@pytest.mark.parametrize("preset", ["q4_0", "q4_1", "q8_0"])
def test_quantised_blocks_are_copied_without_rerounding(checkpoint, tmp_path, preset):
    folder = checkpoint("minicpm", **longrope_256("minicpm"))
    qdir = quantise(folder, get_preset(preset), tmp_path / "q")
    result = lower(qdir, tmp_path / "art", get_preset(preset), source=folder, rtn="folder")
    kind = get_preset(preset).format.split("-")[1].upper()
    path = tmp_path / "art" / "model.gguf"
    assert _assert_blocks_copied(qdir, path, {"q_proj": 4, "k_proj": 2}) == 14
    assert result.layers["model.layers.0.mlp.down_proj"] == kind
    assert result.layers["model.embed_tokens"] == "Q8_0"  # embeddings rule
    assert result.layers["lm_head"] == "Q8_0"
    types = {n: t.tensor_type.name for n, t in _gguf_tensors(path).items()}
    assert types["token_embd.weight"] == types["output.weight"] == "Q8_0"
    # llama.cpp runs it and agrees with the reference model on the same dequantised weights
    # (llama.cpp also rounds activations to 8 bits inside quantised matmuls).
    runner = LlamaCppRunner(path, n_ctx=256, kv_type="f32")
    ids = random_ids(100, seed=3)
    ours = runner.window_logits(ids)
    model = load_quantized(qdir)
    with torch.no_grad():
        ref, _ = model(torch.tensor([ids]), torch.arange(len(ids)), model.empty_cache(1))
    ref = ref[0]
    embed_err = (ours - ref).abs().max().item()
    assert embed_err < 0.1 * ref.abs().max().item()
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.95


@pytest.mark.parametrize("preset", ["q4_0", "q4_1", "q8_0"])
def test_rtn_blocks_are_byte_identical_to_llama_quantize(checkpoint, tmp_path, preset):
    """RTN recipes (default rtn=ggml): every layer tensor equals what llama.cpp's own quantiser
    writes from our F32 GGUF of the same float weights, whether lowered from the quantised folder
    or straight from the float checkpoint (what `arkinfer build` does: quantizes_in_lower)."""
    from arkinfer.backends.gguf.llamacpp_quantize import llamacpp_quantize

    folder = checkpoint("minicpm", **longrope_256("minicpm"))
    recipe = get_preset(preset)
    assert BACKEND.quantizes_in_lower(recipe, {}) and not BACKEND.quantizes_in_lower(
        recipe, {"rtn": "folder"})
    qdir = quantise(folder, recipe, tmp_path / "q")
    result = lower(qdir, tmp_path / "ours", recipe, source=folder)
    assert any("ggml's reference quantiser" in n for n in result.notes)
    assert result.quant is None  # the folder's quantiser already ran
    direct = lower(folder, tmp_path / "direct", recipe)
    bits = {"q4_0": 4.5, "q4_1": 5.0, "q8_0": 8.5}[preset]
    assert direct.quant["bits_per_weight"] == bits
    assert direct.layers == result.layers
    lower(folder, tmp_path / "f32")
    theirs = llamacpp_quantize(tmp_path / "f32" / "model.gguf", tmp_path / "theirs.gguf",
                               preset.upper())
    ref = _gguf_tensors(theirs)
    layer_tensors = [n for n in ref if n.startswith("blk.")]
    assert len(layer_tensors) == 18
    for ours in (_gguf_tensors(tmp_path / "ours" / "model.gguf"),
                 _gguf_tensors(tmp_path / "direct" / "model.gguf")):
        for name in layer_tensors:
            assert ours[name].tensor_type == ref[name].tensor_type, name
            assert np.array_equal(np.asarray(ours[name].data), np.asarray(ref[name].data)), name


def test_ternary_blocks_and_fallback_to_q4_0(checkpoint, tmp_path):
    """TQ2_0 from per-row ternary codes is copied exactly; down_proj (in=320, not a multiple of
    256) stays float in the folder and falls back to Q4_0, which the notes report."""
    folder = checkpoint("llama", hidden_size=256, intermediate_size=320,
                        num_attention_heads=4, num_key_value_heads=2)
    recipe = get_preset("ternary")
    qdir = quantise(folder, recipe, tmp_path / "q")
    result = lower(qdir, tmp_path / "art", recipe, source=folder)
    path = tmp_path / "art" / "model.gguf"
    assert _assert_blocks_copied(qdir, path, {"q_proj": 4, "k_proj": 2}) == 12
    assert result.layers["model.layers.0.mlp.up_proj"] == "TQ2_0"
    assert result.layers["model.layers.0.mlp.down_proj"] == "Q4_0"
    assert any("model.layers.1.mlp.down_proj" in n and "Q4_0" in n for n in result.notes)
    runner = LlamaCppRunner(path, n_ctx=256)
    assert torch.isfinite(runner.window_logits(random_ids(50))).all()


def test_float_build_f16_types_and_embeddings_option(checkpoint, tmp_path):
    folder = checkpoint("llama")
    result = lower(folder, tmp_path, dtype="f16", embeddings="q8_0")
    types = {n: t.tensor_type.name for n, t in _gguf_tensors(tmp_path / "model.gguf").items()}
    assert types["blk.1.ffn_down.weight"] == "F16" and types["token_embd.weight"] == "Q8_0"
    assert types["output_norm.weight"] == "F32"
    assert result.layers["model.layers.1.mlp.down_proj"] == "F16"


def test_refusals_name_the_problem(checkpoint, tmp_path):
    folder = checkpoint("llama")
    with pytest.raises(ArkError, match="dtype 'f8'"):
        lower(folder, tmp_path / "a", dtype="f8")
    with pytest.raises(ArkError, match="embeddings=q2_k"):
        lower(folder, tmp_path / "b", embeddings="q2_k")
    gptq = QuantRecipe("gptq", "gptq", 4, 128)
    with pytest.raises(ArkError, match="'gptq' cannot be stored in GGUF.*gguf-q4_0"):
        BACKEND.preflight({"model_type": "llama"}, gptq, None)  # raises: impossible, not a note
    with pytest.raises(ArkError, match="^model_type 'gpt2'"):
        BACKEND.preflight({"model_type": "gpt2"}, None, None)
    qdir = quantise(folder, QuantRecipe("rtn", "gptq", 4, 128), tmp_path / "gptq")
    with pytest.raises(ArkError, match="'gptq' format, which GGUF cannot hold"):
        lower(qdir, tmp_path / "c", gptq, source=folder)


def test_llama_logs_show_warnings_and_errors_but_not_the_compute_buffer_note(capfd):
    """The runner's llama.cpp log callback (ggml's levels: WARN 3, ERROR 4, CONT 5) prints
    warnings and errors, continues the line it printed, and drops info and the compute-buffer
    size note llama.cpp prints when an InfLLM v2 context is freed."""
    import llama_cpp
    from arkinfer.backends.gguf import llamacpp_lib

    llamacpp_lib.quiet_llama_logs(llama_cpp)
    log = llamacpp_lib._LOG_STATE["callback"]
    log(3, b"graph_infllm: running DENSE attention\n", None)
    log(4, b"failed to decode", None)
    log(5, b" (continued)\n", None)
    log(2, b"model loaded\n", None)
    log(3, b"~llama_context: CPU compute buffer size of 14 MiB, does not match expectation of 7 MiB\n",
        None)
    log(5, b" (continued)\n", None)
    err = capfd.readouterr().err
    assert err == "graph_infllm: running DENSE attention\nfailed to decode (continued)\n"
