"""SmolLM2-135M (the real model) re-exported by the GGUF backend and run by llama.cpp.

Light (CI): the float build keeps the original GGUF's tokenizer (metadata and ids) and its
perplexity. Heavy (`-m heavy`, they quantise the model first): Q8_0 within 1 % of the original
on the whole eval text; RTN Q4_0 byte-identical to llama.cpp's own quantiser; GPTQ Q4_0 blocks
copied unchanged and better than llama.cpp's Q4_0. benchmarks/gguf_quality.py has the table.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("llama_cpp", reason="llama-cpp-python (the [gguf] extra) is not installed")

from arkinfer.backends.gguf.backend import BACKEND
from arkinfer.backends.gguf.llamacpp_quantize import llamacpp_quantize
from arkinfer.backends.gguf.runner import LlamaCppRunner
from arkinfer.quant import QuantRecipe, get_preset

from arkinfer.backend import LowerRequest
from arkinfer.errors import NotAvailableError
from arkinfer.generate import perplexity

pytestmark = pytest.mark.llamacpp
EVAL_TEXT = Path(__file__).resolve().parents[3] / "arkinfer" / "data" / "corpus_eval.txt"
TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                  "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                  "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                  "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
                  "tokenizer.chat_template")
TEXTS = ["Hello world", "I'm sure you're right; they'll say it's fine.",
         "Café naïve résumé — 日本語 Привет 😀🚀", "def f(n):\n    return n * 2  # x\n",
         "1234567890 3.14159 1,000,000", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
         "   leading spaces, inner   runs   and trailing   ", "a\n\n\nb\r\n c \t\t d\n \n"]


@pytest.fixture(scope="module")
def smollm2():
    from arkinfer.testing.smollm2 import smollm2_gguf_path, smollm2_hf_dir

    try:
        return smollm2_gguf_path(), smollm2_hf_dir()
    except NotAvailableError as exc:
        pytest.skip(f"SmolLM2 GGUF not available: {exc}")


@pytest.fixture(scope="module")
def eval_ids(smollm2):
    text = EVAL_TEXT.read_text(encoding="utf-8")
    return LlamaCppRunner(smollm2[0], vocab_only=True).tokenize(text)


def build(tmp: Path, model_dir: Path, source: Path, recipe=None, dtype="f16", **options) -> Path:
    BACKEND.lower(LowerRequest(model_dir, source, recipe, dtype, None, tmp, options=options))
    return tmp / "model.gguf"


def ppl(path: Path, ids: list[int]) -> float:
    return perplexity(LlamaCppRunner(path, n_ctx=512).window_logits, ids, 512).ppl


def test_float_build_keeps_tokenizer_and_quality(smollm2, eval_ids, tmp_path):
    original, hf = smollm2
    ours = build(tmp_path, hf, hf)
    a, b = gguf.GGUFReader(original), gguf.GGUFReader(ours)
    for key in TOKENIZER_KEYS:
        assert b.fields[key].contents() == a.fields[key].contents(), key
    assert b.fields["general.architecture"].contents() == "llama"
    mine = LlamaCppRunner(ours, n_ctx=512)
    ref = LlamaCppRunner(original, n_ctx=512, vocab_only=True)
    for text in TEXTS + [EVAL_TEXT.read_text(encoding="utf-8")]:
        for special in (True, False):
            assert mine.tokenize(text, special=special) == ref.tokenize(text, special=special)
    ids = eval_ids[:512]  # one window; the heavy tests and the benchmark take the whole text
    theirs = ppl(original, ids)
    assert abs(perplexity(mine.window_logits, ids, 512).ppl / theirs - 1) < 0.01


@pytest.fixture(scope="module")
def quantised(smollm2, tmp_path_factory):
    """quantised(name, recipe, samples, seq_len) -> folder written like `arkinfer quantize`."""
    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.calib_data import load_calibration
    from arkinfer.quant.export import export_folder

    from arkinfer.frontend.checkpoint import open_checkpoint

    root = tmp_path_factory.mktemp("smollm2-quantised")

    def make(name: str, recipe: QuantRecipe, samples: int = 4, seq_len: int = 128,
             **options) -> Path:
        ckpt = open_checkpoint(smollm2[1])
        calib = load_calibration(ckpt.tokenizer, None, samples, seq_len, 0, 2)
        run = calibrate(ckpt, recipe, calib, root / f"{name}.work", options=options)
        return export_folder(run, root / name)

    return make


@pytest.mark.heavy
def test_q8_0_within_1_percent_of_the_original(smollm2, eval_ids, quantised, tmp_path):
    original, hf = smollm2
    folder = quantised("q8_0", get_preset("q8_0"))
    ours = build(tmp_path, folder, hf, get_preset("q8_0"))
    assert abs(ppl(ours, eval_ids) / ppl(original, eval_ids) - 1) < 0.01


@pytest.mark.heavy
def test_rtn_q4_0_is_byte_identical_to_llama_quantize(smollm2, quantised, tmp_path):
    _, hf = smollm2
    folder = quantised("q4_0", get_preset("q4_0"))
    ours = build(tmp_path / "ours", folder, hf, get_preset("q4_0"))
    f32 = build(tmp_path / "f32", hf, hf, dtype="f32")
    theirs = llamacpp_quantize(f32, tmp_path / "theirs.gguf", "Q4_0")
    a = {t.name: t for t in gguf.GGUFReader(ours).tensors}
    b = {t.name: t for t in gguf.GGUFReader(theirs).tensors}
    assert sorted(a) == sorted(b) and len(a) == 272
    for name, t in a.items():
        assert t.tensor_type == b[name].tensor_type, name
        assert np.array_equal(np.asarray(t.data), np.asarray(b[name].data)), name


@pytest.mark.heavy
def test_gptq_q4_0_blocks_survive_and_beat_llama_cpp_q4_0(smollm2, eval_ids, quantised,
                                                         tmp_path):
    from safetensors import safe_open

    from arkinfer.frontend.gguf_model import permute_qk

    _, hf = smollm2
    # `arkinfer quantize --preset gptq-q4_0 --act-order --static-groups` (plain GPTQ without
    # act-order loses to ggml's RTN grid on SmolLM2: benchmarks/results/gguf_quality.json)
    recipe = QuantRecipe("gptq", "gguf-q4_0", 4, 32, sym=True)
    folder = quantised("gptq", recipe, samples=32, seq_len=512, act_order=True,
                       static_groups=True)
    ours = build(tmp_path / "ours", folder, hf, recipe)
    tensors = {t.name: t for t in gguf.GGUFReader(ours).tensors}
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    for hf_name, gguf_name, heads in (
            ("model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight", 9),
            ("model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight", 3),
            ("model.layers.29.mlp.down_proj.weight", "blk.29.ffn_down.weight", None)):
        with safe_open(str(folder / index[hf_name]), framework="numpy") as fh:
            blocks = fh.get_tensor(hf_name)
        expected = permute_qk(blocks, heads) if heads else blocks
        got = np.asarray(tensors[gguf_name].data).reshape(expected.shape)
        assert np.array_equal(got, expected), hf_name
    f16 = build(tmp_path / "f16", hf, hf)
    theirs = llamacpp_quantize(f16, tmp_path / "theirs.gguf", "Q4_0")
    assert ppl(ours, eval_ids) < ppl(theirs, eval_ids)
