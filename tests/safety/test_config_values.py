"""Silent wrong configs (issue #37, item 5): values that loaded and generated text, or ended in
"this is a bug in ArkInfer", are now refused at load, or stop generation with one error.

- config.json: an integer literal is range-checked as written, like a float (`"rope_theta": 0`
  was turned into 0.0 after the check); a huge one is refused with its value and the range.
- Non-finite values: every forward call, prefill of any length and each decode step, is checked
  (torch's fused attention hides NaN queries/keys on short sequences, so the logits alone missed
  them); the error names the module where the first NaN/inf appears.
- tokenizer.json: ids beyond the model's vocab_size, too many added tokens, a file over the size
  limit, a Unigram model without unk_id.
- GGUF: tensor data that overlaps another tensor's or is not aligned.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arkinfer.cli.main import app
from arkinfer.errors import ConfigError, GGUFError, TokenizerError
from arkinfer.frontend.demo import demo_model_path
from arkinfer.models import parse_config
from arkinfer.models.configs import tiny_config
from test_run_prompt import assert_clean_error  # one `error:`, a `hint:`, no "bug"

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()


def invoke(*args) -> object:
    return runner.invoke(app, [str(a) for a in args])


def copy_demo(tmp_path: Path, **config_changes) -> Path:
    """A copy of the demo model whose config.json has `config_changes` (written by json.dumps,
    so Python ints stay integer literals: `10**400` is written as 401 digits)."""
    folder = tmp_path / "cfg"
    shutil.copytree(demo_model_path(), folder,
                    ignore=shutil.ignore_patterns("__init__.py", "__pycache__"))
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(config_changes)
    path.write_text(json.dumps(config))
    return folder


# ------------------------------------------------------------ config.json: ints like floats
@pytest.mark.parametrize("key,value,needle", [
    ("rope_theta", 0, "'rope_theta' = 0 is out of range"),
    ("rope_theta", -10000, "'rope_theta' = -10000 is out of range"),
    ("rms_norm_eps", 0, "'rms_norm_eps' = 0 is out of range"),
    ("scale_emb", 0, "'scale_emb' = 0 is out of range"),
    ("scale_depth", 10**30, "'scale_depth' = about 1e+30 is out of range"),
    ("rope_theta", 10**400, "'rope_theta' = about 1e+400 is out of range"),
    ("rope_theta", True, "'rope_theta' must be float, got True"),
], ids=["theta-0", "theta-negative", "eps-0", "scale_emb-0", "scale_depth-1e30", "theta-1e400",
        "theta-bool"])
def test_integer_config_values_are_range_checked_like_floats(tmp_path, key, value, needle):
    folder = copy_demo(tmp_path, **{key: value})
    out = assert_clean_error(invoke("run", folder, "-p", "hi", "-n", "3", "--raw"), needle)
    assert "allowed" in out or "must be float" in out
    assert "OverflowError" not in out


def test_valid_integer_literals_still_load_as_floats():
    config = parse_config(tiny_config("minicpm", rope_theta=10000, rms_norm_eps=1,
                                      scale_emb=12, scale_depth=1))
    assert (config.rope_theta, config.scale_emb, config.scale_depth) == (10000.0, 12.0, 1.0)
    assert all(isinstance(v, float) for v in (config.rope_theta, config.rms_norm_eps,
                                              config.scale_emb, config.scale_depth))


@pytest.mark.parametrize("value", [0, -1, 10**400, -(10**400), 2**1100],
                         ids=["0", "-1", "1e400", "-1e400", "2^1100"])
def test_library_refuses_out_of_range_ints_with_the_range(value):
    with pytest.raises(ConfigError, match="rope_theta.*allowed > 0 and <= 1e\\+12"):
        parse_config(tiny_config("llama", rope_theta=value))


# ------------------------------------------------------- non-finite values on every forward
def _tiny_factor_demo(tmp_path: Path, **scaling) -> Path:
    """The demo with LongRoPE factors of 1e-300 (finite and positive, so the config loads):
    their frequencies overflow float32, so the RoPE tables are NaN/inf."""
    rope = json.loads((demo_model_path() / "config.json").read_text())["rope_scaling"]
    return copy_demo(tmp_path, rope_scaling={**rope, **scaling})


def test_nonfinite_rope_fails_on_a_short_prompt(tmp_path):
    half = [1e-300] * 16
    folder = _tiny_factor_demo(tmp_path, short_factor=half, long_factor=half)
    # 2 prompt tokens: the fused attention hid the NaN keys, and the run printed text, exit 0
    assert_clean_error(invoke("run", folder, "-p", "hi", "-n", "3", "--raw"),
                       "non-finite", "model.layers.0.self_attn", "RoPE")


def test_nonfinite_rope_fails_on_a_decode_step(tmp_path):
    # positions 0..3 use the short (valid) factors, every later one the long (overflowing) ones
    folder = _tiny_factor_demo(tmp_path, long_factor=[1e-300] * 16,
                               original_max_position_embeddings=4)
    out = assert_clean_error(invoke("run", folder, "-p", "hi", "-n", "5", "--raw"),
                             "non-finite", "model.layers.0.self_attn", "positions 4..4")
    assert "bug" not in out


def _nan_weight(folder: Path, name: str) -> None:
    from safetensors.torch import load_file, save_file

    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    shard = folder / weight_map[name]
    tensors = load_file(str(shard))
    tensors[name][3, 5] = float("nan")
    save_file(tensors, str(shard), metadata={"format": "pt"})


@pytest.mark.parametrize("prompt", ["hi", "a longer prompt of more than sixteen tokens, so the "
                                          "attention kernel differs from the short one"])
def test_nan_query_weights_fail_at_any_prompt_length(tmp_path, prompt):
    folder = copy_demo(tmp_path)
    _nan_weight(folder, "model.layers.1.self_attn.q_proj.weight")
    assert_clean_error(invoke("run", folder, "-p", prompt, "-n", "3", "--raw"),
                       "non-finite", "model.layers.1.self_attn.q_proj")


def test_forward_checked_names_the_module_when_the_logits_stay_finite():
    import torch

    from arkinfer.frontend.checkpoint import load
    from arkinfer.generate import NonFiniteError, forward_checked

    _, net = load("demo")
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        net.model.layers[2].self_attn.k_proj.weight[3, 5] = float("nan")
        logits, _ = net(ids, torch.arange(3), net.empty_cache(1))
    assert bool(torch.isfinite(logits).all())  # what the old logits-only check saw
    with pytest.raises(NonFiniteError, match="model.layers.2.self_attn.k_proj"):
        forward_checked(net, ids, torch.arange(3), net.empty_cache(1))


# ------------------------------------------------------------------------ tokenizer.json
def _edit_tokenizer(folder: Path, edit) -> None:
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _added(token_id: int, content: str, special: bool = True) -> dict:
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": special}


def test_added_token_beyond_vocab_size_is_refused_at_load(tmp_path):
    folder = copy_demo(tmp_path)
    _edit_tokenizer(folder, lambda t: t["added_tokens"].append(_added(2048, "<evil>")))
    # before: loaded, then `run` failed with IndexError on the embedding ("this is a bug")
    for args in (["run", folder, "-p", "say <evil>", "-n", "2", "--raw"],
                 ["inspect", folder]):
        assert_clean_error(invoke(*args), "'<evil>'", "id 2048", "vocab_size=2048")


def test_vocabulary_id_beyond_vocab_size_is_refused(tmp_path):
    folder = copy_demo(tmp_path)
    _edit_tokenizer(folder, lambda t: t["model"]["vocab"].update({"zzzq": 9999}))
    assert_clean_error(invoke("inspect", folder), "'zzzq'", "id 9999")


def test_too_many_added_tokens_are_refused(tmp_path, monkeypatch):
    from arkinfer.frontend import tokenizer

    monkeypatch.setattr(tokenizer, "MAX_ADDED_TOKENS", 5)  # the demo has 7
    with pytest.raises(TokenizerError, match="7 added tokens; the limit is 5"):
        tokenizer.load_tokenizer(demo_model_path())


def test_oversized_tokenizer_is_refused_before_it_is_read(tmp_path):
    from arkinfer.frontend.tokenizer import TOKENIZER_MAX_BYTES

    folder = copy_demo(tmp_path)
    with open(folder / "tokenizer.json", "r+b") as fh:  # sparse: no disk used, nothing parsed
        fh.truncate(TOKENIZER_MAX_BYTES + 1)
    assert_clean_error(invoke("inspect", folder), "tokenizer.json", "limit")


def test_unigram_tokenizer_without_unk_id_is_an_ordinary_error(tmp_path):
    from tokenizers import Tokenizer, models

    folder = copy_demo(tmp_path)
    vocab = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)] + \
        [(c, -1.0) for c in "abcdefghijklmnopqrstuvwxyz "]
    Tokenizer(models.Unigram(vocab, None)).save(str(folder / "tokenizer.json"))
    assert json.loads((folder / "tokenizer.json").read_text())["model"]["unk_id"] is None
    out = assert_clean_error(invoke("run", folder, "-p", "hello WORLD", "-n", "2", "--raw"),
                             "unk_id")
    assert "cannot be encoded" in out


# --------------------------------------------------------------------------------- GGUF
def _tiny_gguf(tmp_path: Path) -> Path:
    from arkinfer.testing.gguf_synthetic import write_tiny_gguf

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, "llama")
    return path


def _move_tensor(path: Path, name: str, offset_of: str | None = None, delta: int = 0) -> None:
    """Point tensor `name` at `offset_of`'s data (or its own) plus `delta` bytes, in place."""
    from gguf import GGUFReader

    reader = GGUFReader(path, "r+")
    by_name = {t.name: t for t in reader.tensors}
    source = by_name[offset_of or name]
    by_name[name].field.parts[-1][0] = source.data_offset - reader.data_offset + delta
    reader.data.flush()
    del reader


def test_gguf_tensors_sharing_bytes_are_refused(tmp_path):
    path = _tiny_gguf(tmp_path)
    _move_tensor(path, "blk.0.attn_k.weight", offset_of="blk.0.attn_q.weight")
    out = assert_clean_error(invoke("import", path, tmp_path / "out"), "overlap")
    assert "blk.0.attn_q.weight" in out and "blk.0.attn_k.weight" in out
    assert not (tmp_path / "out").exists()


def test_gguf_misaligned_tensor_is_refused(tmp_path):
    path = _tiny_gguf(tmp_path)
    _move_tensor(path, "output_norm.weight", delta=4)
    assert_clean_error(invoke("import", path, tmp_path / "out"), "'output_norm.weight'",
                       "general.alignment=32")


def test_gguf_reader_accepts_the_writer_layout(tmp_path):
    from arkinfer.frontend.gguf_reader import GGUFFile

    assert "blk.0.attn_q.weight" in GGUFFile(_tiny_gguf(tmp_path)).tensors


def test_gguf_overlap_is_a_gguf_error(tmp_path):
    from arkinfer.frontend.gguf_reader import GGUFFile

    path = _tiny_gguf(tmp_path)
    _move_tensor(path, "blk.1.ffn_up.weight", offset_of="blk.1.ffn_gate.weight", delta=64)
    with pytest.raises(GGUFError, match="overlap"):
        GGUFFile(path)
    assert os.path.getsize(path) > 0
