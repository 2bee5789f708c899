"""The EAGLE-3 draft head: one decoder layer over (token embedding, target hidden state).

Read top to bottom: `Eagle3Config` (the config.json keys of SpecForge / SGLang's
`LlamaForCausalLMEagle3`), the head's KV cache, the module, then `load_eagle3` / `save_eagle3`.
Module attribute names equal the checkpoint names, so the file loads with no renaming.

Shapes: T new positions, S cached positions, H hidden, nh / nkv heads, hd head_dim, I the MLP
width, V the target's vocabulary, Vd the draft vocabulary.

    fc.weight                                  [H, 3H]   input cat(tap_i, tap_j, tap_k)
    midlayer.input_layernorm.weight            [H]       on the token embeddings
    midlayer.hidden_norm.weight                [H]       on the incoming hidden state
    midlayer.self_attn.q_proj.weight           [nh*hd, 2H]; k_proj, v_proj [nkv*hd, 2H]
    midlayer.self_attn.o_proj.weight           [H, nh*hd]
    midlayer.post_attention_layernorm.weight   [H]
    midlayer.mlp.gate_proj / up_proj.weight    [I, H];  down_proj [H, I]
    norm.weight [H];  lm_head.weight [Vd, H]
    d2t  int64 [Vd]: draft id d is target id d + d2t[d]
    t2d  bool  [V]:  whether a target id is in the draft vocabulary
    embed_tokens.weight [V, H]  optional: SGLang heads share the target's (`target_embeddings`)

A tap i is the target's residual stream at the INPUT of its decoder layer i (1 <= i <= L - 1).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from arkinfer.errors import ArkError, CheckpointError
from arkinfer.models.config_values import REQUIRED, ConfigReader
from arkinfer.models.llama import MLP, RMSNorm
from arkinfer.ops import attention as _attention_op  # noqa: F401 - registers arkinfer::attention
from arkinfer.ops import rope as rope_ops

ARCHITECTURE = "LlamaForCausalLMEagle3"
WEIGHTS = "model.safetensors"
FLOAT_TAGS = ("F32", "BF16", "F16")


@dataclass(frozen=True)
class Eagle3Config:
    """The head's config.json (HF names in `to_hf`; `tap_layers` is
    eagle_config.eagle_aux_hidden_state_layer_ids, `embed_scale` is arkinfer_embed_scale: the
    target's embedding multiplier, 1.0 for Llama, MiniCPM's scale_emb)."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    draft_vocab_size: int
    tap_layers: tuple[int, int, int]
    embed_scale: float = 1.0
    max_position_embeddings: int = 4096

    @classmethod
    def from_hf(cls, raw: dict[str, Any], source: str = "config.json") -> Eagle3Config:
        r = ConfigReader(raw, source)
        archs = raw.get("architectures") or []
        r.check(ARCHITECTURE in archs, f"'architectures' = {archs!r} does not name {ARCHITECTURE}")
        heads = r.get("num_attention_heads", int)
        hidden = r.get("hidden_size", int)
        default_dim = hidden // heads if hidden and heads and hidden % heads == 0 else REQUIRED
        eagle = r.get("eagle_config", dict, {})
        taps = eagle.get("eagle_aux_hidden_state_layer_ids")
        ok_taps = (isinstance(taps, list) and len(taps) == 3
                   and all(isinstance(i, int) and not isinstance(i, bool) and i >= 1 for i in taps))
        r.check(ok_taps, f"'eagle_config.eagle_aux_hidden_state_layer_ids' must be 3 layer ids "
                f">= 1 (the target layers whose inputs the head reads), got {taps!r}")
        cfg = {
            "hidden_size": hidden, "num_attention_heads": heads,
            "num_key_value_heads": r.get("num_key_value_heads", int, heads),
            "head_dim": r.get("head_dim", int, default_dim),
            "intermediate_size": r.get("intermediate_size", int),
            "rms_norm_eps": r.get("rms_norm_eps", float, 1e-6),
            "rope_theta": r.get("rope_theta", float, 10000.0),
            "vocab_size": r.get("vocab_size", int),
            "draft_vocab_size": r.get("draft_vocab_size", int, raw.get("vocab_size")),
            "tap_layers": tuple(taps) if ok_taps else (1, 1, 1),
            "embed_scale": r.get("arkinfer_embed_scale", float, 1.0),
            "max_position_embeddings": r.get("max_position_embeddings", int, 4096),
        }
        kv, vocab, draft = cfg["num_key_value_heads"], cfg["vocab_size"], cfg["draft_vocab_size"]
        r.check(not (heads and kv) or heads % kv == 0,
                f"num_attention_heads={heads} must be a multiple of num_key_value_heads={kv}")
        r.check(not isinstance(cfg["head_dim"], int) or cfg["head_dim"] % 2 == 0,
                f"head_dim={cfg['head_dim']} must be even (RoPE pairs dimensions)")
        r.check(not (vocab and draft) or 1 <= draft <= vocab,
                f"draft_vocab_size={draft} must be 1..vocab_size={vocab}")
        r.finish()
        return cls(**cfg)

    def to_hf(self) -> dict[str, Any]:
        return {
            "architectures": [ARCHITECTURE], "model_type": "llama",
            "hidden_size": self.hidden_size, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size, "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size,
            "max_position_embeddings": self.max_position_embeddings, "num_hidden_layers": 1,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.tap_layers)},
            "arkinfer_embed_scale": self.embed_scale,
        }


class Eagle3Cache:
    """The head's KV cache: k, v float32 [nkv, S, hd], post-RoPE; position p is row p. Held in
    buffers [nkv, capacity, hd] that grow by doubling, so a one-token step appends in place (the
    native step, eagle3_native.py, writes its row straight into them)."""

    def __init__(self, cfg: Eagle3Config, capacity: int = 256) -> None:
        self._k = torch.zeros(cfg.num_key_value_heads, capacity, cfg.head_dim)
        self._v = torch.zeros(cfg.num_key_value_heads, capacity, cfg.head_dim)
        self.length = 0

    @property
    def k(self) -> Tensor:
        return self._k[:, :self.length]

    @property
    def v(self) -> Tensor:
        return self._v[:, :self.length]

    def reserve(self, n: int) -> None:
        """Room for `n` positions in the buffers (doubling; the cached rows are kept)."""
        capacity = self._k.shape[1]
        if n <= capacity:
            return
        while capacity < n:
            capacity *= 2
        for name in ("_k", "_v"):
            old = getattr(self, name)
            grown = old.new_zeros(old.shape[0], capacity, old.shape[2])
            grown[:, :self.length] = old[:, :self.length]
            setattr(self, name, grown)

    def append(self, k: Tensor, v: Tensor) -> None:
        """Add T positions: k, v [nkv, T, hd]."""
        t = k.shape[1]
        self.reserve(self.length + t)
        self._k[:, self.length:self.length + t] = k
        self._v[:, self.length:self.length + t] = v
        self.length += t

    def truncate(self, n: int) -> None:
        """Keep the first n positions."""
        if not 0 <= n <= self.length:
            raise ArkError(f"cannot truncate the EAGLE-3 head's cache to {n} positions: it holds "
                           f"{self.length}", hint="truncate only to a length it already holds")
        self.length = n


class Eagle3Attention(nn.Module):
    """q, k, v from cat(embedding, hidden) [.., 2H]; plain RoPE; o_proj back to H."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        h2, nh, nkv, hd = 2 * cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(h2, nh * hd, bias=False)
        self.k_proj = nn.Linear(h2, nkv * hd, bias=False)
        self.v_proj = nn.Linear(h2, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, cfg.hidden_size, bias=False)


class Eagle3Layer(nn.Module):
    """SpecForge's Eagle3 `LlamaDecoderLayer`, split at the attention so that training can attend
    over its own key layout (`project`, your attention, `complete`)."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)  # gate/up/down with SiLU: the Llama MLP, read by field name
        self.register_buffer("inv_freq", rope_ops.default_inv_freq(cfg.head_dim, cfg.rope_theta),
                             persistent=False)

    def project(self, embeds: Tensor, hidden: Tensor, positions: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
        """embeds, hidden [B, T, H], positions [T] -> q [B, nh, T, hd], k, v [B, nkv, T, hd]
        (q and k rotated)."""
        cfg, attn = self.cfg, self.self_attn
        b, t, _ = hidden.shape
        z = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        q = attn.q_proj(z).view(b, t, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
        k = attn.k_proj(z).view(b, t, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        v = attn.v_proj(z).view(b, t, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        q = torch.ops.arkinfer.rope(q, positions, self.inv_freq, 1.0)
        k = torch.ops.arkinfer.rope(k, positions, self.inv_freq, 1.0)
        return q, k, v

    def complete(self, attended: Tensor, hidden: Tensor) -> Tensor:
        """attended [B, nh, T, hd], hidden [B, T, H] (the layer's input) -> output hidden [B, T, H]."""
        b, _, t, _ = attended.shape
        h = hidden + self.self_attn.o_proj(attended.transpose(1, 2).reshape(b, t, -1))
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """The head (module docstring). `d2t` int64 [Vd] and `t2d` bool [V] are buffers;
    `embed_tokens` is the target's embedding table (frozen: no gradient)."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h, _weight=torch.zeros(cfg.vocab_size, h))
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(3 * h, h, bias=False)
        self.midlayer = Eagle3Layer(cfg)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    def fuse(self, taps: Tensor) -> Tensor:
        """taps [.., 3H] (cat of the three taps, in tap_layers order) -> [.., H]."""
        return self.fc(taps.float())

    def embed(self, ids: Tensor) -> Tensor:
        """ids int64 [..] -> [.., H], scaled by embed_scale as the target scales its own."""
        return self.embed_tokens(ids) * self.config.embed_scale

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden [.., H] (pre-norm) -> float32 logits [.., Vd] over the draft vocabulary."""
        return self.lm_head(self.norm(hidden)).float()

    def forward(self, embeds: Tensor, hidden: Tensor, positions: Tensor, cache: Eagle3Cache
                ) -> tuple[Tensor, Tensor]:
        """embeds, hidden [T, H], positions [T] int64 (= cache.length .. + T - 1) ->
        (hidden_out [T, H] pre-norm, logits [T, Vd] float32). Appends the T positions to `cache`."""
        layer = self.midlayer
        q, k, v = layer.project(embeds[None].float(), hidden[None].float(), positions)
        cache.append(k[0].detach(), v[0].detach())
        # queries are the last T of the S cached keys: causal over the whole cache
        attended = torch.ops.arkinfer.attention(q, cache.k[None], cache.v[None],
                                                1.0 / math.sqrt(self.config.head_dim))
        out = layer.complete(attended, hidden[None].float())[0]
        return out, self.logits(out)

    def to_target(self, draft_ids: Tensor) -> Tensor:
        """Draft-vocabulary ids (any shape) -> the target's ids: d + d2t[d]."""
        return draft_ids + self.d2t[draft_ids]

    def new_cache(self) -> Eagle3Cache:
        return Eagle3Cache(self.config)


def expected_tensors(cfg: Eagle3Config) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, kind) of every tensor in the file; kind "float", "int64" or "bool"."""
    with torch.device("meta"):
        head = Eagle3Head(cfg)
    table = {n: (tuple(t.shape), "float") for n, t in head.state_dict().items()}
    table["d2t"] = ((cfg.draft_vocab_size,), "int64")
    table["t2d"] = ((cfg.vocab_size,), "bool")
    return table


def load_eagle3(path: str | Path, *, target_vocab_size: int | None = None,
                target_hidden_size: int | None = None, target_layers: int | None = None,
                target_embeddings: Tensor | None = None) -> Eagle3Head:
    """The head in folder `path` (config.json + model.safetensors), float32, eval mode.

    Checked against the target (the target_* arguments given) before any weight is read, then
    strictly against the config: one CheckpointError lists every missing, unexpected, mis-shaped
    or mistyped tensor. `target_embeddings` [V, H] (the target's unscaled embedding table) is used
    when the file has no embed_tokens.weight."""
    from arkinfer.frontend.safetensors_io import LazyWeights

    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{folder} has no config.json: it is not an EAGLE-3 head folder",
                              hint="give the folder holding the head's config.json and model.safetensors")
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{config_file} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{config_file} must hold a JSON object")
    cfg = Eagle3Config.from_hf(raw, str(config_file))
    _check_fit(cfg, folder, target_vocab_size, target_hidden_size, target_layers)
    if not (folder / WEIGHTS).is_file():
        raise CheckpointError(f"{folder} has no {WEIGHTS}", hint="an EAGLE-3 head is one "
                              "config.json and one model.safetensors")
    weights = LazyWeights([folder / WEIGHTS])
    expected = expected_tensors(cfg)
    if "embed_tokens.weight" not in weights:
        if target_embeddings is None:
            raise CheckpointError(f"{folder / WEIGHTS} has no embed_tokens.weight and no target "
                                  "embeddings were given", hint="load the head with the target's "
                                  "embedding table (target_embeddings=), or use a head that stores one")
        expected.pop("embed_tokens.weight")
        got = tuple(target_embeddings.shape)
        if got != expected_tensors(cfg)["embed_tokens.weight"][0]:
            raise ArkError(f"the target's embeddings are {list(got)}; the head needs "
                           f"[{cfg.vocab_size}, {cfg.hidden_size}]", hint="use a head trained for this model")
    _check_tensors(expected, weights, folder / WEIGHTS)
    state = {n: weights.get(n).to(torch.float32, copy=True) if kind == "float" else weights.get(n).clone()
             for n, (_, kind) in expected.items()}
    if "embed_tokens.weight" not in state:
        state["embed_tokens.weight"] = target_embeddings.detach().float().clone()
    return build_head(cfg, state)


def build_head(cfg: Eagle3Config, state: dict[str, Tensor]) -> Eagle3Head:
    """A head holding the tensors of `state` (every name of the layout, shapes checked by
    the caller; the tensors are used as they are, not copied), in eval mode."""
    with torch.device("meta"):
        head = Eagle3Head(cfg)
    head.load_state_dict(state, strict=True, assign=True)
    head.midlayer.inv_freq = rope_ops.default_inv_freq(cfg.head_dim, cfg.rope_theta)
    head.embed_tokens.weight.requires_grad_(False)
    return head.eval()


def _check_fit(cfg: Eagle3Config, folder: Path, vocab: int | None, hidden: int | None,
               layers: int | None) -> None:
    problems = []
    if vocab is not None and vocab != cfg.vocab_size:
        problems.append(f"vocab_size {cfg.vocab_size} (the target's: {vocab})")
    if hidden is not None and hidden != cfg.hidden_size:
        problems.append(f"hidden_size {cfg.hidden_size} (the target's: {hidden})")
    if layers is not None and not all(1 <= i <= layers - 1 for i in cfg.tap_layers):
        problems.append(f"tap layers {list(cfg.tap_layers)} (the target has {layers} layers, "
                        f"so taps must be 1..{layers - 1})")
    if problems:
        raise ArkError(f"the EAGLE-3 head in {folder} does not fit this model: it has "
                       + "; ".join(problems),
                       hint="use a head trained for this target, or train one: "
                       "python examples/eagle3/train_eagle3_head.py --target MODEL_DIR")


def _check_tensors(expected: dict[str, tuple[tuple[int, ...], str]], weights, file: Path) -> None:
    want_tags = {"float": FLOAT_TAGS, "int64": ("I64",), "bool": ("BOOL",)}
    lines = []
    missing = [n for n in expected if n not in weights]
    unexpected = [n for n in weights.names() if n not in expected]
    misshaped = [f"{n}: file {list(weights.shape(n))}, expected {list(shape)}"
                 for n, (shape, _) in expected.items() if n in weights and weights.shape(n) != shape]
    mistyped = [f"{n}: file {weights.infos[n].dtype}, expected {'/'.join(want_tags[kind])}"
                for n, (_, kind) in expected.items()
                if n in weights and weights.infos[n].dtype not in want_tags[kind]]
    for title, items in (("missing", missing), ("unexpected", unexpected),
                         ("wrong shape", misshaped), ("wrong dtype", mistyped)):
        if items:
            lines.append(f"{title} ({len(items)}): " + "; ".join(items))
    if lines:
        raise CheckpointError(f"tensors in {file} do not match the EAGLE-3 head described by its "
                              "config.json:\n  " + "\n  ".join(lines),
                              hint="the config and the weights come from different heads, or the "
                              "export was incomplete")


def save_eagle3(head: Eagle3Head, path: str | Path, dtype: torch.dtype = torch.float32) -> None:
    """Write config.json + model.safetensors (floats in `dtype`, embed_tokens included) to `path`.

    Written to a temporary folder beside `path` first: a new `path` appears whole (one rename);
    in an existing folder each file is replaced by a rename, config.json last, and other files
    (a README) are kept."""
    from safetensors.torch import save_file

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {n: (t.detach().to(dtype) if t.is_floating_point() else t.detach()).contiguous()
             for n, t in head.state_dict().items()}
    tmp = Path(tempfile.mkdtemp(prefix=".eagle3-", dir=out.parent))
    try:
        save_file(state, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(head.config.to_hf(), indent=2) + "\n")
        # mkdtemp makes the folder private: give the head the usual permissions of a model folder
        os.chmod(tmp, 0o755)
        for name in (WEIGHTS, "config.json"):
            os.chmod(tmp / name, 0o644)
        if not out.exists():
            os.replace(tmp, out)
            return
        for name in (WEIGHTS, "config.json"):
            os.replace(tmp / name, out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
