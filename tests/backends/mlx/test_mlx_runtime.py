"""ArkInfer's MLX runtime (backends/mlx: model.py, infllmv2.py, runner.py) on mlx[cpu].

Independent references: ArkInfer's PyTorch reference model on the artifact's exact weights
(`reference_folder`: dequantised by quant/formats/mlx.py's numpy unpack), and mlx-lm itself
(`mlx_lm.convert` writes the SmolLM2 folder; `mlx_lm.load` + `generate_step` run it).

Light: tiny checkpoints of every architecture and the demo MiniCPM (4-bit, group 64), written
with mx.quantize in mlx-lm's layout. Heavy (`-m heavy`, minutes on mlx[cpu]): SmolLM2-135M 4-bit
g64 against the reference model (top-1), mlx-lm's greedy tokens and its perplexity.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

mx = pytest.importorskip("mlx.core", reason="pip install 'arkinfer[mlx]'")

from arkinfer.backends.mlx import metal_kernel  # noqa: E402
from arkinfer.backends.mlx.reference import reference_folder  # noqa: E402
from arkinfer.backends.mlx.runner import MlxRunner, load_runner  # noqa: E402

from arkinfer.frontend.demo import demo_model_path  # noqa: E402
from arkinfer.errors import ArkError, CheckpointError  # noqa: E402
from arkinfer.frontend.safetensors_io import weight_files  # noqa: E402
from arkinfer.generate import perplexity  # noqa: E402
from arkinfer.ops.infllmv2 import compress_keys  # noqa: E402
from arkinfer.pipeline.reference_runner import ReferenceRunner  # noqa: E402
from arkinfer.pipeline.verify import parity_metrics, verification_prompts  # noqa: E402
from arkinfer.testing.runners import greedy_tokens  # noqa: E402

EVAL_TEXT = Path(__file__).resolve().parents[3] / "arkinfer" / "data" / "corpus_eval.txt"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "generation_config.json")
# A small InfLLM v2 config so a tiny model runs sparse within 200 tokens: blocks of 16, budget
# 6 blocks (96 keys), dense below 150 tokens.
SMALL_SPARSE = {"kernel_size": 8, "kernel_stride": 4, "block_size": 16, "init_blocks": 1,
                "window_size": 32, "topk": 4, "use_nope": False, "dense_len": 150}


def mlx_folder(src: Path, out: Path, bits: int | None = 4, group: int = 64,
               quantize_embedding: bool = False) -> Path:
    """`src` (HF float folder) in mlx-lm's layout: every linear (and optionally the embedding)
    mx.quantize'd, fp32 scales/biases, config.json with mlx-lm's "quantization"."""
    out.mkdir(parents=True, exist_ok=True)
    arrays: dict = {}
    for f in weight_files(src):
        arrays.update(mx.load(str(f)))
    tensors = {}
    for name, a in arrays.items():
        a = a.astype(mx.float32)
        owner = name.removesuffix(".weight")
        linear = name.endswith("_proj.weight") or name == "lm_head.weight" or (
            quantize_embedding and name == "model.embed_tokens.weight")
        if bits and linear:
            q, s, b = mx.quantize(a, group_size=group, bits=bits)
            tensors.update({f"{owner}.weight": q, f"{owner}.scales": s, f"{owner}.biases": b})
        else:
            tensors[name] = a
    mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": "mlx"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["torch_dtype"] = "float32"
    if bits:
        cfg["quantization"] = {"group_size": group, "bits": bits, "mode": "affine"}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    return out


def eval_ids(runner, n: int) -> list[int]:
    ids = runner.tokenize(EVAL_TEXT.read_text(encoding="utf-8"))
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def random_ids(vocab: int, n: int, seed: int = 0) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def demo_q4(tmp_path_factory) -> Path:
    return mlx_folder(demo_model_path(), tmp_path_factory.mktemp("mlx") / "demo-q4")


@pytest.fixture(scope="module")
def demo_runner(demo_q4) -> MlxRunner:
    return load_runner(demo_q4, {})


# -- the demo MiniCPM, 4-bit g64 --------------------------------------------------------------
def test_demo_4bit_matches_reference_model(demo_runner, demo_q4):
    reference = ReferenceRunner(reference_folder(demo_q4))
    prompts = verification_prompts(reference.tokenizer, {}, n=3)  # short verify prompts
    metrics = parity_metrics(reference, demo_runner, prompts)
    assert metrics["top1_agreement"] >= 0.99, metrics
    assert metrics["max_abs_logit_diff"] < 1e-3, metrics
    assert demo_runner.tokenize("Hello world") == reference.tokenize("Hello world")


def test_prefill_and_decode_equal_one_window(demo_runner):
    ids = eval_ids(demo_runner, 40)
    window = demo_runner.window_logits(ids)
    demo_runner.reset()
    steps = [demo_runner.prefill(ids[:30])] + [demo_runner.decode(t) for t in ids[30:]]
    torch.testing.assert_close(torch.stack(steps), window[29:], atol=2e-4, rtol=1e-4)


@pytest.mark.heavy
def test_demo_past_dense_len_same_tokens_as_reference(demo_runner, demo_q4):
    """The demo's own sparse_config (dense_len 1024, budget 8 blocks of 64): a 1000-token
    prompt, then 40 greedy tokens; decoding crosses dense_len (one-time compression)."""
    reference = ReferenceRunner(reference_folder(demo_q4))
    prompt = eval_ids(demo_runner, 1000)
    assert greedy_tokens(demo_runner, prompt, 40) == greedy_tokens(reference, prompt, 40)
    assert demo_runner.cache[0].infllm.length == 1040


@pytest.fixture(scope="module")
def sparse_folder(tmp_path_factory) -> Path:
    """A tiny MiniCPM4 (LongRoPE, scales, GQA) with SMALL_SPARSE, 4-bit g64."""
    from arkinfer.models.configs import tiny_config
    from arkinfer.testing.synthetic import write_checkpoint

    root = tmp_path_factory.mktemp("mlx-sparse")
    src = write_checkpoint(root / "hf", tiny_config("minicpm", sparse_config=SMALL_SPARSE))
    return mlx_folder(src, root / "mlx")


def test_sparse_minicpm_past_dense_len_same_tokens_as_reference(sparse_folder):
    """Prompt of 140 tokens (dense), 40 greedy tokens: decoding crosses dense_len=150, compresses
    the cache once, then runs InfLLM v2 (6 of up to 12 blocks) with the compressed keys carried
    in the KV cache; the tokens are the reference model's, and the carried state equals
    recompressing the cache."""
    runner = load_runner(sparse_folder, {})
    reference = ReferenceRunner(reference_folder(sparse_folder))
    prompt = random_ids(runner.vocab_size, 140, seed=1)
    assert greedy_tokens(runner, prompt, 40) == greedy_tokens(reference, prompt, 40)
    layer = runner.cache[1]
    assert layer.length == 180 and layer.infllm is not None and layer.infllm.length == 180
    k, _ = layer.filled()
    full = compress_keys(torch.from_numpy(np.array(k)), runner.model.sparse)
    np.testing.assert_array_equal(np.array(layer.infllm.fine), full.fine.numpy())
    np.testing.assert_array_equal(np.array(layer.infllm.coarse), full.coarse.numpy())


def test_attention_switch(sparse_folder, demo_runner):
    runner = load_runner(sparse_folder, {})
    assert runner.attention_modes == ("dense", "sparse")
    ids = random_ids(runner.vocab_size, 200, seed=2)
    runner.set_attention("dense")
    dense = runner.window_logits(ids)[-40:]
    runner.set_attention("sparse")
    sparse = runner.window_logits(ids)[-40:]
    assert float((dense - sparse).abs().max()) > 1e-3  # InfLLM v2 really ran past dense_len
    reference = ReferenceRunner(reference_folder(sparse_folder), dense=True)
    torch.testing.assert_close(dense, reference.window_logits(ids)[-40:], atol=2e-4, rtol=1e-3)
    with pytest.raises(ArkError, match="cannot switch attention"):
        runner.set_attention("banana")


# -- every architecture, tiny ----------------------------------------------------------------
@pytest.mark.parametrize("model_type,overrides,bits", [
    ("llama", {}, 4), ("llama", {"tie_word_embeddings": True}, 8), ("qwen2", {}, 4),
    ("qwen3", {}, 4), ("mistral", {}, None),
    ("minicpm", {}, 4),                                         # LongRoPE long factors past 64
    ("minicpm", {"tie_word_embeddings": True, "sparse_config": SMALL_SPARSE}, 4),  # sparse
])
def test_architectures_match_reference(tiny_checkpoint, tmp_path, model_type, overrides, bits):
    src = tiny_checkpoint(model_type, **overrides)
    folder = mlx_folder(src, tmp_path / "mlx", bits=bits,
                        quantize_embedding=bool(overrides.get("tie_word_embeddings")))
    runner = load_runner(folder, {})
    reference = ReferenceRunner(reference_folder(folder))
    ids = random_ids(runner.vocab_size, 200)
    ours, theirs = runner.window_logits(ids), reference.window_logits(ids)
    assert float((ours.argmax(-1) == theirs.argmax(-1)).float().mean()) >= 0.99
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-3)
    assert greedy_tokens(runner, ids[:140], 20) == greedy_tokens(reference, ids[:140], 20)


def test_quantised_embedding_is_read(tiny_checkpoint, tmp_path):
    folder = mlx_folder(tiny_checkpoint("llama", tie_word_embeddings=True), tmp_path / "m",
                        quantize_embedding=True)
    runner = load_runner(folder, {})
    assert runner.model.w["model.embed_tokens"].table.scales is not None


# -- bad artifacts -----------------------------------------------------------------------------
def test_missing_and_misshaped_tensors_are_listed(tiny_checkpoint, tmp_path):
    folder = mlx_folder(tiny_checkpoint("llama"), tmp_path / "m")
    tensors = mx.load(str(folder / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.scales"], tensors["model.norm.weight"]
    tensors["model.layers.0.self_attn.q_proj.biases"] = mx.zeros((128, 3))
    tensors["extra.weight"] = mx.zeros((2,))
    mx.save_safetensors(str(folder / "model.safetensors"), tensors)
    with pytest.raises(CheckpointError) as exc:
        load_runner(folder, {})
    msg = str(exc.value)
    for part in ("model.norm.weight", "q_proj.biases' has shape [128, 3], expected [128, 2]",
                 "extra.weight", "missing 'model.layers.1.mlp.up_proj.scales'"):
        assert part in msg, msg


def test_config_group_size_must_match_the_tensors(tiny_checkpoint, tmp_path):
    folder = mlx_folder(tiny_checkpoint("llama"), tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization"]["group_size"] = 32
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="group_size 32"):
        load_runner(folder, {})


def test_token_outside_vocabulary(demo_runner):
    with pytest.raises(ArkError, match="outside the vocabulary"):
        demo_runner.window_logits([1, 5_000_000])


# -- the Metal kernel: built here, run only where Metal exists --------------------------------
def test_metal_kernel_builds_and_is_gated():
    assert callable(metal_kernel.kernel())
    if mx.metal.is_available():  # a Mac: the gate opens unless switched off
        assert metal_kernel.metal_available() == (
            os.environ.get("ARKINFER_MLX_METAL_KERNEL") != "0")
        return
    assert not metal_kernel.metal_available()
    q = mx.zeros((1, 2, 1, 64))
    k = mx.zeros((1, 1, 32, 64))
    with pytest.raises(Exception, match="(?i)metal"):
        mx.eval(metal_kernel.block_sparse_decode(q, k, k, mx.zeros((1, 1, 1, 2), mx.int32),
                                                 scale=0.125, block_size=16, cache_len=31))


# -- SmolLM2-135M, 4-bit g64, written by mlx-lm itself (heavy: minutes on mlx[cpu]) ------------
@pytest.fixture(scope="module")
def smollm2_q4(tmp_path_factory) -> Path:
    from arkinfer.testing.smollm2 import smollm2_hf_dir

    pytest.importorskip("mlx_lm")
    from mlx_lm import convert

    out = tmp_path_factory.mktemp("mlx") / "smollm2-q4-g64"
    convert(str(smollm2_hf_dir()), mlx_path=str(out), quantize=True, q_group_size=64, q_bits=4)
    # mlx-lm copies "quantization" to "quantization_config", which ArkInfer's reference loader
    # reads as an HF quantiser; ArkInfer's own artifacts carry only "quantization".
    cfg = json.loads((out / "config.json").read_text())
    assert cfg.pop("quantization_config") == cfg["quantization"]
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


@pytest.mark.heavy
def test_smollm2_matches_reference_model(smollm2_q4):
    runner = load_runner(smollm2_q4, {})
    reference = ReferenceRunner(reference_folder(smollm2_q4))
    metrics = parity_metrics(reference, runner, verification_prompts(reference.tokenizer, {}))
    assert metrics["top1_agreement"] >= 0.99, metrics


@pytest.mark.heavy
def test_smollm2_greedy_and_perplexity_equal_mlx_lm(smollm2_q4):
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, _ = load(str(smollm2_q4))
    runner = load_runner(smollm2_q4, {})
    for text in ("The capital of France is", "def fibonacci(n):",
                 "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"):
        prompt = runner.tokenize(text)
        theirs = [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=32)]
        assert greedy_tokens(runner, prompt, 32) == theirs, text

    def mlx_lm_logits(window: list[int]) -> torch.Tensor:
        return torch.from_numpy(np.array(model(mx.array([window]))[0].astype(mx.float32)))

    ids = eval_ids(runner, 256)
    ours = perplexity(runner.window_logits, ids, 128).ppl
    theirs = perplexity(mlx_lm_logits, ids, 128).ppl
    assert abs(ours / theirs - 1) < 1e-3, (ours, theirs)
