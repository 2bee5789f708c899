"""GGUF import on tiny synthetic files written like llama.cpp's converter writes them."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

gguf = pytest.importorskip("gguf")

from arkinfer.errors import GGUFError
from arkinfer.frontend import gguf_model
from arkinfer.frontend.gguf_import import import_gguf
from arkinfer.frontend.gguf_model import permute_qk, unpermute_qk
from arkinfer.frontend.gguf_reader import GGUFFile
from arkinfer.testing.gguf_synthetic import write_tiny_gguf


def _load(folder):
    from arkinfer.frontend.safetensors_io import LazyWeights, weight_files

    weights = LazyWeights(weight_files(folder))
    return {name: weights.get(name).float().numpy() for name in weights.names()}


def _cli():
    from arkinfer.cli import import_

    app = typer.Typer()
    app.command(name="import")(import_.command)
    app.callback()(lambda: None)
    return app


def _leftovers(parent, keep=()):
    return sorted(p.name for p in parent.iterdir() if p.name not in keep)


# -- q/k permutation ---------------------------------------------------------------------------

def _converter_permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim in numpy."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


@pytest.mark.parametrize("n_head,head_dim,cols", [(1, 2, 3), (4, 8, 16), (9, 64, 576), (3, 64, 0)])
def test_permute_unpermute_identity(n_head, head_dim, cols):
    rng = np.random.default_rng(0)
    shape = (n_head * head_dim, cols) if cols else (n_head * head_dim,)
    w = rng.standard_normal(shape).astype(np.float32)
    assert np.array_equal(permute_qk(w, n_head), _converter_permute(w, n_head))
    assert np.array_equal(unpermute_qk(permute_qk(w, n_head), n_head), w)
    assert np.array_equal(permute_qk(unpermute_qk(w, n_head), n_head), w)
    if head_dim > 2:
        assert not np.array_equal(permute_qk(w, n_head), w)


def test_unpermute_turns_interleaved_rope_into_rotate_half():
    """Why the permutation exists: GGUF rows + interleaved RoPE == HF rows + rotate-half RoPE."""
    rng = np.random.default_rng(1)
    heads, d, hidden, pos = 3, 8, 12, 5
    w_hf = rng.standard_normal((heads * d, hidden))
    x = rng.standard_normal(hidden)
    angle = pos * 10000.0 ** (-np.arange(d // 2) * 2 / d)
    cos, sin = np.cos(angle), np.sin(angle)

    def rotate_half(q):  # HF: pairs (i, i + d/2)
        a, b = q[: d // 2], q[d // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin])

    def interleaved(q):  # llama.cpp NORM: pairs (2i, 2i + 1)
        a, b = q[0::2], q[1::2]
        out = np.empty_like(q)
        out[0::2], out[1::2] = a * cos - b * sin, b * cos + a * sin
        return out

    q_hf = (w_hf @ x).reshape(heads, d)
    q_gguf = (permute_qk(w_hf, heads) @ x).reshape(heads, d)
    expected = np.stack([rotate_half(q) for q in q_hf]).reshape(-1, 1)
    got = unpermute_qk(np.stack([interleaved(q) for q in q_gguf]).reshape(-1, 1), heads)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


# -- tiny round trips --------------------------------------------------------------------------

@pytest.mark.parametrize("arch,tied,tokenizer", [
    ("llama", False, "gpt2"), ("llama", True, "llama"), ("minicpm", False, "llama"),
    ("minicpm", True, "gpt2"), ("qwen2", False, "gpt2"), ("qwen3", True, "gpt2"),
])
def test_tiny_roundtrip_exact(tmp_path, arch, tied, tokenizer):
    src = tmp_path / "tiny.gguf"
    originals = write_tiny_gguf(src, arch, tied=tied, tokenizer=tokenizer)
    result = import_gguf(src, tmp_path / "hf")
    got = _load(tmp_path / "hf")
    assert set(got) == set(originals)
    for name, tensor in originals.items():
        assert np.array_equal(got[name], tensor), name
    assert ("lm_head.weight" in got) is not tied
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is tied and result.tied_embeddings is tied
    assert result.parameters == sum(t.size for t in originals.values())
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    assert _leftovers(tmp_path) == ["hf", "tiny.gguf"]


def test_llama_config(tmp_path):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, "llama", tied=True, layers=3, hidden=64, heads=4, kv_heads=2, ffn=96)
    import_gguf(src, tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    expected = {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 96,
                "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                "max_position_embeddings": 256, "tie_word_embeddings": True, "bos_token_id": 1,
                "eos_token_id": 2, "pad_token_id": 2, "torch_dtype": "float32",
                "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
                "rope_scaling": None}
    assert {k: cfg[k] for k in expected} == expected
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert gen["bos_token_id"] == 1 and gen["eos_token_id"] == 2


def test_minicpm_config_scales_and_longrope(tmp_path):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, "minicpm", tokenizer="llama", layers=4, hidden=128, heads=4, kv_heads=2)
    import_gguf(src, tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["architectures"] == ["MiniCPMForCausalLM"] and cfg["model_type"] == "minicpm"
    assert (cfg["scale_emb"], cfg["scale_depth"], cfg["dim_model_base"]) == (12, 1.4, 32)
    rope = cfg["rope_scaling"]
    assert rope["rope_type"] == "longrope" and rope["original_max_position_embeddings"] == 256
    np.testing.assert_allclose(rope["long_factor"], np.linspace(1, 8, 16), rtol=1e-6)
    np.testing.assert_allclose(rope["short_factor"], np.linspace(1, 2, 16), rtol=1e-6)
    assert "rope_factors_long.weight" not in _load(tmp_path / "hf")


@pytest.mark.parametrize("arch", ["llama", "minicpm"])
def test_imported_folder_loads_in_arkinfer(tmp_path, arch):
    from arkinfer.frontend.checkpoint import load

    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, arch, tokenizer="gpt2", tied=arch == "minicpm")
    import_gguf(src, tmp_path / "hf")
    ckpt, _model = load(tmp_path / "hf")
    assert ckpt.config.num_hidden_layers == 2 and ckpt.tokenizer is not None
    assert ckpt.tokenizer.render_chat([{"role": "user", "content": "hi"}]) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_1", "Q4_0"])
def test_quantised_tensors_equal_gguf_dequantize(tmp_path, quant):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, "llama", quant=quant)
    import_gguf(src, tmp_path / "hf")
    got = _load(tmp_path / "hf")
    reader = gguf.GGUFReader(src)
    heads = {"attn_q": 4, "attn_k": 2}
    for t in reader.tensors:
        hf_name = gguf_model.GLOBAL_NAMES.get(t.name)
        if hf_name is None:
            _, layer, suffix = t.name.split(".", 2)
            hf_name = f"model.layers.{layer}.{gguf_model.LAYER_NAMES[suffix]}"
        ref = gguf.quants.dequantize(t.data, t.tensor_type)
        ours = got[hf_name]
        kind = t.name.split(".")[-2]
        if kind in heads:
            ours = permute_qk(ours, heads[kind])
        assert np.array_equal(ours, ref), t.name


@pytest.mark.parametrize("dtype,tag,torch_dtype", [("bf16", "BF16", "bfloat16"),
                                                    ("f16", "F16", "float16")])
def test_dtype_option(tmp_path, dtype, tag, torch_dtype):
    src = tmp_path / "tiny.gguf"
    originals = write_tiny_gguf(src, "llama")
    result = import_gguf(src, tmp_path / "hf", dtype=dtype)
    raw = (tmp_path / "hf" / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {tag}
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["torch_dtype"] == torch_dtype and result.dtype == dtype
    got = _load(tmp_path / "hf")
    for name, tensor in originals.items():
        np.testing.assert_allclose(got[name], tensor, rtol=1e-2, atol=1e-3)


def test_sharded_output_with_index(tmp_path):
    src = tmp_path / "tiny.gguf"
    originals = write_tiny_gguf(src, "llama")
    result = import_gguf(src, tmp_path / "hf", max_shard_bytes=40_000)
    shards = sorted(p.name for p in (tmp_path / "hf").glob("*.safetensors"))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(originals)
    assert index["metadata"]["total_size"] == 4 * sum(t.size for t in originals.values())
    assert "model.safetensors.index.json" in result.files
    got = _load(tmp_path / "hf")
    assert all(np.array_equal(got[n], t) for n, t in originals.items())


def test_progress_callback(tmp_path):
    src = tmp_path / "tiny.gguf"
    originals = write_tiny_gguf(src, "llama")
    calls = []
    import_gguf(src, tmp_path / "hf", progress=lambda d, t, n: calls.append((d, t, n)))
    total = len(originals)
    assert calls[0] == (0, total, "")
    assert [c[0] for c in calls] == list(range(total + 1))
    assert {c[2] for c in calls[1:]} == set(originals)


# -- refusals and failures ---------------------------------------------------------------------

@pytest.mark.parametrize("content", [b"", b"not a gguf at all\n" * 10, b"GGUF\x03\x00\x00\x00"])
def test_not_a_gguf(tmp_path, content):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    with pytest.raises(GGUFError):
        import_gguf(bad, tmp_path / "out")
    result = CliRunner().invoke(_cli(), ["import", str(bad), str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "error:" in result.output and "Traceback" not in result.output
    assert _leftovers(tmp_path) == ["bad.gguf"]


@pytest.mark.parametrize("keep", [0.5, 0.999, 200])
def test_truncated_gguf(tmp_path, keep):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, "llama")
    data = src.read_bytes()
    src.write_bytes(data[: int(len(data) * keep) if keep < 1 else keep])
    with pytest.raises(GGUFError, match="truncated|not a readable GGUF"):
        import_gguf(src, tmp_path / "sub" / "out")
    result = CliRunner().invoke(_cli(), ["import", str(src), str(tmp_path / "out")])
    assert result.exit_code == 1 and "error:" in result.output
    assert _leftovers(tmp_path) == ["tiny.gguf"]


def test_unsupported_architecture(tmp_path):
    src = tmp_path / "falcon.gguf"
    w = gguf.GGUFWriter(str(src), "falcon")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(GGUFError, match="'falcon'") as info:
        import_gguf(src, tmp_path / "out")
    assert "llama" in info.value.hint and "minicpm" in info.value.hint


def test_unknown_pre_tokenizer_refused(tmp_path):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, "llama", pre="some-new-model")
    with pytest.raises(GGUFError, match="some-new-model") as info:
        import_gguf(src, tmp_path / "out")
    assert "smollm" in info.value.hint
    assert _leftovers(tmp_path) == ["tiny.gguf"]


def test_nonempty_out_dir_refused_then_forced(tmp_path):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, "llama")
    out = tmp_path / "out"
    import_gguf(src, out)
    with pytest.raises(GGUFError, match="already exists") as info:
        import_gguf(src, out)
    assert "--force" in info.value.hint
    result = CliRunner().invoke(_cli(), ["import", str(src), str(out)])
    assert result.exit_code == 1 and "already exists" in result.output
    import_gguf(src, out, force=True)  # replaces its own earlier output
    assert (out / "config.json").exists()
    assert _leftovers(tmp_path) == ["out", "tiny.gguf"]
    with pytest.raises(GGUFError, match="contains the GGUF file"):
        import_gguf(src, tmp_path, force=True)


def test_force_never_replaces_a_folder_it_did_not_write(tmp_path):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, "llama")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(GGUFError, match="not an ArkInfer import") as info:
        import_gguf(src, out, force=True)
    assert "even with --force" in info.value.message and (out / "keep.txt").read_text() == "mine"


def test_failure_midway_leaves_nothing(tmp_path, monkeypatch):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, "llama")
    real, calls = gguf_model.hf_tensor, []

    def flaky(f, plan):
        calls.append(plan.hf_name)
        if len(calls) == 5:
            raise GGUFError("simulated failure")
        return real(f, plan)

    monkeypatch.setattr(gguf_model, "hf_tensor", flaky)
    with pytest.raises(GGUFError, match="simulated"):
        import_gguf(src, tmp_path / "new" / "deeper" / "out")
    assert _leftovers(tmp_path) == ["tiny.gguf"]
    out = tmp_path / "existing"
    monkeypatch.setattr(gguf_model, "hf_tensor", real)
    import_gguf(src, out)  # an earlier, complete import
    before = sorted(p.name for p in out.iterdir())
    monkeypatch.setattr(gguf_model, "hf_tensor", flaky)
    calls.clear()
    with pytest.raises(GGUFError, match="simulated"):
        import_gguf(src, out, force=True)
    assert _leftovers(out) == before and _leftovers(tmp_path) == ["existing", "tiny.gguf"]


def test_reader_metadata(tmp_path):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, "llama", hidden=64)
    f = GGUFFile(src)
    assert f.arch == "llama" and f.get_int("llama.embedding_length") == 64
    assert f.get_float("llama.attention.layer_norm_rms_epsilon") == 1e-5
    with pytest.raises(GGUFError, match="llama.no_such_key"):
        f.get_arch("no_such_key")
    assert f.tensors["token_embd.weight"].shape == (320, 64)


# -- CLI ---------------------------------------------------------------------------------------

def test_cli_import_summary_and_json(tmp_path):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, "minicpm", tied=True)
    result = CliRunner().invoke(_cli(), ["import", str(src), str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    for text in ("minicpm", "MiniCPMForCausalLM", "tied", "byte-level BPE", str(tmp_path / "hf")):
        assert text in result.output
    result = CliRunner().invoke(_cli(), ["import", str(src), str(tmp_path / "hf2"), "--json",
                                         "--dtype", "bf16", "--max-shard-size", "20KB"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["model_type"] == "minicpm" and info["dtype"] == "bf16" and info["layers"] == 2
    assert "model.safetensors.index.json" in info["files"]


def test_cli_bad_shard_size(tmp_path):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, "llama")
    result = CliRunner().invoke(_cli(), ["import", str(src), str(tmp_path / "hf"),
                                         "--max-shard-size", "lots"])
    assert result.exit_code == 1 and "5GB" in result.output


# -- tokenizer parity with llama.cpp on the synthetic vocabularies ------------------------------

PARITY_TEXTS = [
    "Hello world", "The quick brown fox jumps over the lazy dog.", "the theory of the other thing",
    "Café naïve — Zürich", "日本語と中文", "emoji 😀🚀 done", "def main():\n    return 42\n",
    "   leading and trailing   ", "a\n\n\tb\r\n c", "1234567 3.14", "I'm sure they'll",
    "<|im_start|>user\nhi<|im_end|>\n", "<s>text</s><unk><tool_call>", "", " ", "\n",
]


@pytest.mark.llamacpp
@pytest.mark.parametrize("tokenizer", ["gpt2", "llama"])
def test_synthetic_tokenizer_ids_identical_to_llamacpp(tmp_path, tokenizer):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from tokenizers import Tokenizer

    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, "llama", tokenizer=tokenizer)
    import_gguf(src, tmp_path / "hf")
    tok = Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    ref = llama_cpp.Llama(str(src), vocab_only=True, verbose=False)
    mismatches = []
    for text in PARITY_TEXTS:
        for special in (True, False):
            for add_bos in (True, False):
                tok.encode_special_tokens = not special
                ours = tok.encode(text, add_special_tokens=add_bos).ids
                theirs = ref.tokenize(text.encode(), add_bos=add_bos, special=special)
                if ours != theirs:
                    mismatches.append((text, special, add_bos, theirs, ours))
        tok.encode_special_tokens = False
        ids = tok.encode(text, add_special_tokens=False).ids
        if tokenizer == "gpt2" or "<" not in text:  # SPM puts "▁" after a special token
            assert tok.decode(ids, skip_special_tokens=False) == text
    assert not mismatches, mismatches[:3]


def test_gguf_path_as_model_argument_is_imported_once_into_the_cache(tmp_path, monkeypatch):
    from arkinfer.frontend.checkpoint import open_checkpoint, resolve_model_path
    from arkinfer.testing.gguf_synthetic import write_tiny_gguf

    monkeypatch.setenv("ARKINFER_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf)
    folder = resolve_model_path(str(gguf))
    assert folder.parent == tmp_path / "cache" / "imported" and (folder / "config.json").exists()
    stamp = (folder / "config.json").stat().st_mtime_ns
    assert resolve_model_path(str(gguf)) == folder
    assert (folder / "config.json").stat().st_mtime_ns == stamp  # reused, not re-imported
    assert open_checkpoint(gguf).config.model_type == "llama"
