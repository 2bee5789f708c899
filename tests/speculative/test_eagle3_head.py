"""The EAGLE-3 head: its checkpoint layout (round trip, strictness), its forward against a plain
torch implementation written here, FR-Spec's vocabulary restriction, the demo's trained head and
the training script."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from arkinfer.errors import ArkError
from arkinfer.frontend.checkpoint import load
from arkinfer.frontend.demo import demo_model_path
from arkinfer.speculative.eagle3_head import (
    Eagle3Config,
    Eagle3Head,
    load_eagle3,
    save_eagle3,
)
from arkinfer.speculative.frspec import (
    frequent_vocabulary,
    restrict_head,
    token_frequencies,
)

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "eagle3" / "train_eagle3_head.py"
CFG = Eagle3Config(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   intermediate_size=40, rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=60,
                   draft_vocab_size=60, tap_layers=(1, 2, 3), embed_scale=3.0)
DEMO_TOP1_FLOOR = 0.32  # the shipped head reaches 0.351 on these 8 windows (0.331 on all held-out)


def random_head(cfg: Eagle3Config = CFG, seed: int = 0) -> Eagle3Head:
    """Every weight random (norms included), full draft vocabulary."""
    torch.manual_seed(seed)
    head = Eagle3Head(cfg)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 1.0) + (p.dim() == 1))
        head.t2d[:] = True
    return head.eval()


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x [heads, T, hd]: rotate-half RoPE."""
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = (positions.double()[:, None] * inv[None]).float()
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    return x * cos + torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1) * sin


def reference_forward(head: Eagle3Head, embeds, hidden) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's math from position 0, plain torch (no ArkInfer ops): (hidden_out, logits)."""
    cfg, w = head.config, {k: v.detach() for k, v in head.state_dict().items()}
    eps, t, nh, nkv, hd = cfg.rms_norm_eps, embeds.shape[0], cfg.num_attention_heads, \
        cfg.num_key_value_heads, cfg.head_dim
    z = torch.cat([rms(embeds, w["midlayer.input_layernorm.weight"], eps),
                   rms(hidden, w["midlayer.hidden_norm.weight"], eps)], -1)
    pos = torch.arange(t)
    q = rotate((z @ w["midlayer.self_attn.q_proj.weight"].T).view(t, nh, hd).transpose(0, 1), pos,
               cfg.rope_theta)
    k = rotate((z @ w["midlayer.self_attn.k_proj.weight"].T).view(t, nkv, hd).transpose(0, 1), pos,
               cfg.rope_theta)
    v = (z @ w["midlayer.self_attn.v_proj.weight"].T).view(t, nkv, hd).transpose(0, 1)
    k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(t, -1)
    h = hidden + attn @ w["midlayer.self_attn.o_proj.weight"].T
    x = rms(h, w["midlayer.post_attention_layernorm.weight"], eps)
    gate, up = x @ w["midlayer.mlp.gate_proj.weight"].T, x @ w["midlayer.mlp.up_proj.weight"].T
    h = h + (F.silu(gate) * up) @ w["midlayer.mlp.down_proj.weight"].T
    return h, rms(h, w["norm.weight"], eps) @ w["lm_head.weight"].T


def inputs(head: Eagle3Head, t: int = 9, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, head.config.vocab_size, (t,), generator=gen)
    taps = torch.randn(t, 3 * head.config.hidden_size, generator=gen)
    return head.embed(ids), head.fuse(taps)


# --- layout -------------------------------------------------------------------------------------

def test_config_round_trip():
    raw = CFG.to_hf()
    assert raw["architectures"] == ["LlamaForCausalLMEagle3"]
    assert raw["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}
    assert Eagle3Config.from_hf(json.loads(json.dumps(raw))) == CFG


def test_config_errors_name_the_key():
    raw = dict(CFG.to_hf(), eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 2]})
    with pytest.raises(ArkError, match="eagle_aux_hidden_state_layer_ids"):
        Eagle3Config.from_hf(raw)
    with pytest.raises(ArkError, match="draft_vocab_size=61"):
        Eagle3Config.from_hf(dict(CFG.to_hf(), draft_vocab_size=61))


def test_save_load_round_trip_is_bit_identical(tmp_path):
    head = random_head()
    save_eagle3(head, tmp_path / "h")
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == ["config.json", "model.safetensors"]
    back = load_eagle3(tmp_path / "h", target_vocab_size=60, target_hidden_size=16, target_layers=4)
    assert back.config == head.config
    want, got = head.state_dict(), back.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[n], got[n]) and want[n].dtype == got[n].dtype for n in want)
    (tmp_path / "h" / "README.md").write_text("kept")
    save_eagle3(head, tmp_path / "h")  # into an existing folder: other files stay
    assert (tmp_path / "h" / "README.md").read_text() == "kept"


def _rewrite(folder: Path, change) -> None:
    state = load_file(str(folder / "model.safetensors"))
    change(state)
    save_file(state, str(folder / "model.safetensors"))


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop("midlayer.mlp.up_proj.weight"), r"missing \(1\): midlayer.mlp.up_proj.weight"),
    (lambda s: s.update(extra=torch.zeros(2)), r"unexpected \(1\): extra"),
    (lambda s: s.update({"fc.weight": torch.zeros(16, 47)}), r"fc.weight: file \[16, 47\], expected \[16, 48\]"),
    (lambda s: s.update(d2t=s["d2t"].int()), r"d2t: file I32, expected I64"),
])
def test_strict_tensors(tmp_path, change, message):
    save_eagle3(random_head(), tmp_path / "h")
    _rewrite(tmp_path / "h", change)
    with pytest.raises(ArkError, match=message):
        load_eagle3(tmp_path / "h")


@pytest.mark.parametrize("kwargs, message", [
    ({"target_vocab_size": 61}, r"vocab_size 60 \(the target's: 61\)"),
    ({"target_hidden_size": 32}, r"hidden_size 16 \(the target's: 32\)"),
    ({"target_layers": 3}, r"tap layers \[1, 2, 3\] \(the target has 3 layers, so taps must be 1..2\)"),
])
def test_head_that_does_not_fit_the_target(tmp_path, kwargs, message):
    save_eagle3(random_head(), tmp_path / "h")
    (tmp_path / "h" / "model.safetensors").write_bytes(b"not read")  # refused before the weights
    with pytest.raises(ArkError, match=message):
        load_eagle3(tmp_path / "h", **kwargs)


def test_embeddings_from_the_target(tmp_path):
    head = random_head()
    save_eagle3(head, tmp_path / "h")
    _rewrite(tmp_path / "h", lambda s: s.pop("embed_tokens.weight"))
    with pytest.raises(ArkError, match="no embed_tokens.weight"):
        load_eagle3(tmp_path / "h")
    with pytest.raises(ArkError, match=r"the target's embeddings are \[60, 8\]"):
        load_eagle3(tmp_path / "h", target_embeddings=torch.zeros(60, 8))
    back = load_eagle3(tmp_path / "h", target_embeddings=head.embed_tokens.weight)
    assert torch.equal(back.embed_tokens.weight, head.embed_tokens.weight)


# --- forward ------------------------------------------------------------------------------------

@torch.no_grad()
def test_forward_equals_plain_torch_and_steps_equal_whole():
    head = random_head()
    embeds, hidden = inputs(head)
    whole_h, whole_logits = head(embeds, hidden, torch.arange(9), head.new_cache())
    ref_h, ref_logits = reference_forward(head, embeds, hidden)
    torch.testing.assert_close(whole_h, ref_h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(whole_logits, ref_logits, rtol=1e-5, atol=1e-5)
    cache, rows = head.new_cache(), []
    for start, stop in ((0, 4), (4, 5), (5, 6), (6, 9)):
        rows.append(head(embeds[start:stop], hidden[start:stop], torch.arange(start, stop), cache)[1])
    assert cache.length == 9 and cache.k.shape == (2, 9, 8)
    torch.testing.assert_close(torch.cat(rows), whole_logits, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_truncate_then_forward_equals_fresh():
    head = random_head()
    embeds, hidden = inputs(head)
    other_e, other_h = inputs(head, seed=7)
    cache = head.new_cache()
    head(embeds[:6], hidden[:6], torch.arange(6), cache)
    head(other_e[:3], other_h[:3], torch.arange(6, 9), cache)  # drafted, then rejected
    cache.truncate(6)
    got = head(embeds[6:], hidden[6:], torch.arange(6, 9), cache)[1]
    want = head(embeds, hidden, torch.arange(9), head.new_cache())[1][6:]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ArkError, match="truncate .* to 10 positions: it holds 9"):
        cache.truncate(10)


# --- FR-Spec ------------------------------------------------------------------------------------

def test_token_frequencies():
    freq = token_frequencies([[1, 2, 2], [], [5, 2]], 6)
    assert freq.tolist() == [0, 1, 3, 0, 0, 1] and freq.dtype == torch.int64
    with pytest.raises(ArkError, match="token id 6"):
        token_frequencies([[6]], 6)


def test_frequent_vocabulary_ties_and_always():
    freq = torch.tensor([5, 1, 5, 0, 2, 2])
    assert frequent_vocabulary(freq, 3).tolist() == [0, 2, 4]  # 4 beats 5 on the tie
    assert frequent_vocabulary(freq, 3, always=[3]).tolist() == [0, 2, 3]
    assert frequent_vocabulary(freq, 6).tolist() == list(range(6))
    for k in (0, 7):
        with pytest.raises(ArkError, match=f"k={k} .* V=6") as err:
            frequent_vocabulary(freq, k)
        assert "--draft-vocab K must be 1..V" in err.value.hint


@torch.no_grad()
def test_restrict_head_keeps_the_rows_of_kept_ids():
    head = random_head()
    before = {n: t.clone() for n, t in head.state_dict().items()}
    keep = torch.tensor([3, 17, 18, 59])
    small = restrict_head(head, keep)
    assert small.config.draft_vocab_size == 4 and small.lm_head.weight.shape == (4, 16)
    assert small.to_target(torch.arange(4)).tolist() == keep.tolist()
    assert small.t2d.nonzero().flatten().tolist() == keep.tolist()
    embeds, hidden = inputs(head)
    full = head(embeds, hidden, torch.arange(9), head.new_cache())[1]
    part = small(embeds, hidden, torch.arange(9), small.new_cache())[1]
    torch.testing.assert_close(part, full[:, keep], rtol=1e-6, atol=1e-6)
    assert all(torch.equal(before[n], t) for n, t in head.state_dict().items())  # unchanged
    again = restrict_head(small, torch.tensor([0, 18, 59]))  # 0 is not in small's vocabulary
    assert again.to_target(torch.arange(2)).tolist() == [18, 59]


# --- the demo's head and the training script ----------------------------------------------------

def _script():
    spec = importlib.util.spec_from_file_location("train_eagle3_head", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_head_agrees_with_the_demo():
    """Held-out 1-step top-1 agreement of the shipped head, through its cached forward."""
    from arkinfer.frontend.demo import demo_eagle3_path

    train = _script()
    ckpt, model = load(demo_model_path(), dense=True)
    head = load_eagle3(demo_eagle3_path(), target_vocab_size=ckpt.config.vocab_size,
                       target_hidden_size=ckpt.config.hidden_size,
                       target_layers=ckpt.config.num_hidden_layers)
    docs, _ = train.documents(ckpt.tokenizer, train.HELD_OUT.read_text(encoding="utf-8"))
    tokens = train.windows(docs, 96)[:8]
    taps, logits = train.target_pass(model, tokens, head.config.tap_layers)
    hits = 0
    with torch.no_grad():
        for t, x, y in zip(taps, tokens, logits):
            _, draft = head(head.embed(x[1:]), head.fuse(t[:-1]), torch.arange(95), head.new_cache())
            hits += int((head.to_target(draft.argmax(-1)) == y[1:].float().argmax(-1)).sum())
    assert hits / (8 * 95) > DEMO_TOP1_FLOOR


def test_training_script_runs_and_its_head_loads(tmp_path):
    out = tmp_path / "head"
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--steps", "3",
                          "--batch", "2", "--seq-len", "32", "--generate", "0",
                          "--draft-vocab", "500", "--threads", "1"],
                         check=False, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "held-out agreement" in run.stdout
    head = load_eagle3(out, target_vocab_size=2048, target_hidden_size=128, target_layers=4)
    assert head.config.draft_vocab_size == 500 and int(head.t2d.sum()) == 500
