"""Llama family reference model: Llama 2/3, SmolLM2, Mistral, Qwen2 (q/k/v biases), Qwen3 (q/k norms).

Read top to bottom: `LlamaConfig` (HF config.json keys), the modules, then `expected_weights`.
Module attribute names equal the HF checkpoint names (`model.layers.3.self_attn.q_proj.weight`),
so a checkpoint loads with no renaming. The KV cache is functional: `forward` takes the cache of
every layer and returns the extended one, so prefill and decode are both plain traceable calls.

Shapes: B batch, T new tokens, S = cache length after this call, H hidden, Hq / Hkv heads,
D head_dim, V vocab.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from arkinfer.errors import ConfigError
from arkinfer.models.config_values import ConfigReader, range_problem
from arkinfer.ops import attention as _attention_op  # noqa: F401 - registers arkinfer::attention
from arkinfer.ops import norm as _norm_op  # noqa: F401
from arkinfer.ops import rope as rope_ops

LayerCache = tuple[Tensor, Tensor]  # k, v: [B, Hkv, S, D]
TORCH_DTYPES = ("float32", "float16", "bfloat16", "float64")  # config.json `torch_dtype` values


@dataclass(frozen=True)
class LlamaConfig:
    """HF config.json fields of the Llama family (names as in HF)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: q/k/v biases
    qk_norm: bool = False  # Qwen3: RMSNorm on q and k per head, before RoPE
    rope_scaling: dict[str, Any] | None = None
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_id: Any = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # MiniCPM4 scales (1.0 for the Llama family): h = embed*e; h += r*block(h); logits = lm_head(h/l)
    @property
    def embedding_scale(self) -> float:
        return 1.0

    @property
    def residual_scale(self) -> float:
        return 1.0

    @property
    def logit_divisor(self) -> float:
        return 1.0

    @classmethod
    def from_hf(cls, raw: dict[str, Any], source: str = "config.json") -> LlamaConfig:
        r = ConfigReader(raw, source)
        kw = cls._read_common(r, raw)
        model_type = kw["model_type"]
        kw["attention_bias"] = r.get("attention_bias", bool, model_type == "qwen2")
        kw["qk_norm"] = model_type == "qwen3"
        use_window = raw.get("use_sliding_window", model_type == "mistral")
        kw["sliding_window"] = r.get("sliding_window", int, None) if use_window else None
        r.finish()
        return cls(**kw)

    @staticmethod
    def _read_common(r: ConfigReader, raw: dict[str, Any]) -> dict[str, Any]:
        kw: dict[str, Any] = dict(
            model_type=r.get("model_type", str),
            vocab_size=r.get("vocab_size", int),
            hidden_size=r.get("hidden_size", int),
            intermediate_size=r.get("intermediate_size", int),
            num_hidden_layers=r.get("num_hidden_layers", int),
            num_attention_heads=r.get("num_attention_heads", int),
            rms_norm_eps=r.get("rms_norm_eps", float, 1e-6),
            rope_theta=r.get("rope_theta", float, 10000.0),
            max_position_embeddings=r.get("max_position_embeddings", int, 4096),
            tie_word_embeddings=r.get("tie_word_embeddings", bool, False),
            rope_scaling=r.get("rope_scaling", dict, None),
            bos_token_id=r.get("bos_token_id", int, None),
            eos_token_id=raw.get("eos_token_id"),
            raw=raw,
        )
        heads, hidden = kw["num_attention_heads"], kw["hidden_size"]
        kw["num_key_value_heads"] = r.get("num_key_value_heads", int, heads)
        kv = kw["num_key_value_heads"]
        if heads and hidden:
            r.check(heads > 0 and kv is not None and kv > 0 and heads % kv == 0,
                    f"num_attention_heads={heads} must be a positive multiple of "
                    f"num_key_value_heads={kv}")
            default_dim = hidden // heads if hidden % heads == 0 else None
            kw["head_dim"] = r.get("head_dim", int, default_dim)
            derived = (range_problem("head_dim", default_dim)
                       if "head_dim" not in raw and default_dim is not None else None)
            r.check(derived is None, f"{derived} (hidden_size / num_attention_heads)")
            r.check(kw["head_dim"] is not None and kw["head_dim"] % 2 == 0,
                    f"head_dim must be even (hidden_size={hidden}, heads={heads})")
        act = raw.get("hidden_act", "silu")
        r.check(act == "silu", f"hidden_act={act!r} is not supported (only 'silu')")
        torch_dtype = raw.get("torch_dtype")
        r.check(torch_dtype is None or torch_dtype in TORCH_DTYPES,
                f"'torch_dtype' = {torch_dtype!r} is not supported; allowed {', '.join(TORCH_DTYPES)}")
        for problem in token_id_problems(raw, kw["vocab_size"]):
            r.check(False, problem)
        if kw["rope_scaling"]:
            for problem in rope_scaling_problems(kw["rope_scaling"], kw.get("head_dim")):
                r.check(False, problem)
        return kw

    def inv_freq(self, total_len: int) -> tuple[Tensor, float]:
        """RoPE frequencies [head_dim/2] and attention scale for a call whose cache ends at total_len."""
        scaling = self.rope_scaling or {}
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        d, theta = self.head_dim, self.rope_theta
        if kind == "default":
            return rope_ops.default_inv_freq(d, theta), 1.0
        if kind == "linear":
            return rope_ops.default_inv_freq(d, theta) / float(scaling["factor"]), 1.0
        if kind == "llama3":
            return rope_ops.llama3_inv_freq(
                d, theta, float(scaling["factor"]), float(scaling["low_freq_factor"]),
                float(scaling["high_freq_factor"]), int(scaling["original_max_position_embeddings"]),
            ), 1.0
        if kind == "longrope":
            orig = int(scaling.get("original_max_position_embeddings", self.max_position_embeddings))
            factors = scaling["long_factor"] if total_len > orig else scaling["short_factor"]
            scale = rope_ops.longrope_attention_scale(self.max_position_embeddings, orig)
            return rope_ops.longrope_inv_freq(d, theta, factors), scale
        raise ConfigError(f"rope_scaling type {kind!r} is not supported",
                          hint="supported: default, linear, llama3, longrope")


def token_id_problems(raw: dict[str, Any], vocab_size: int | None) -> list[str]:
    """Problems of bos/eos/pad_token_id: each an int (eos: or a list of ints) below vocab_size.

    A negative bos/pad id means "none" in some published configs and is accepted."""
    problems = []
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = raw.get(key)
        ids = value if key == "eos_token_id" and isinstance(value, list) else [value]
        for tid in ids:
            if tid is None or (key != "eos_token_id" and isinstance(tid, int)
                               and not isinstance(tid, bool) and tid < 0):
                continue
            if not isinstance(tid, int) or isinstance(tid, bool) or tid < 0:
                problems.append(f"'{key}' must be a token id (int >= 0), got {value!r}")
            elif vocab_size and tid >= vocab_size:
                problems.append(f"'{key}' = {tid} is beyond the vocabulary; allowed "
                                f"0..{vocab_size - 1} (vocab_size={vocab_size})")
    return problems


ROPE_KEYS: dict[str, tuple[str, ...]] = {
    "default": (), "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "longrope": ("long_factor", "short_factor"),
}


def rope_scaling_problems(scaling: dict[str, Any], head_dim: int | None) -> list[str]:
    """Problems of a `rope_scaling` dict whose type ArkInfer implements (ROPE_KEYS): required keys
    present, numbers finite and in range (`config_values.INT_LIMITS` / `FLOAT_LIMITS`), LongRoPE lists
    of head_dim/2 positive numbers. Other types are reported when a model is run, not here, so
    `inspect` still describes them."""
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if not isinstance(kind, str):
        return [f"'rope_scaling.rope_type' must be a string, got {kind!r}"]
    if kind not in ROPE_KEYS:
        return []
    problems = [f"'rope_scaling' of type {kind!r} lacks '{k}'" for k in ROPE_KEYS[kind]
                if k not in scaling]
    for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        value = scaling.get(key)
        if value is None or kind == "default":
            continue
        want_int = key == "original_max_position_embeddings"
        if isinstance(value, bool) or not isinstance(value, int if want_int else (int, float)):
            problems.append(f"'rope_scaling.{key}' must be {'an int' if want_int else 'a number'}, "
                            f"got {value!r}")
        elif (problem := range_problem(key, value)) is not None:
            problems.append(problem.replace(f"'{key}'", f"'rope_scaling.{key}'", 1))
    low, high = scaling.get("low_freq_factor"), scaling.get("high_freq_factor")
    if kind == "llama3" and not problems and high <= low:
        problems.append(f"'rope_scaling.high_freq_factor' ({high!r}) must be greater than "
                        f"'low_freq_factor' ({low!r})")
    for key in ("long_factor", "short_factor") if kind == "longrope" else ():
        factors = scaling.get(key)
        if factors is None:
            continue
        if not isinstance(factors, list) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                and x > 0 for x in factors):
            problems.append(f"'rope_scaling.{key}' must be a list of positive finite numbers")
        elif head_dim and len(factors) != head_dim // 2:
            problems.append(f"'rope_scaling.{key}' has {len(factors)} entries; head_dim/2 = "
                            f"{head_dim // 2} required")
    return problems


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        hq, hkv, d, h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        self.cfg, self.hq, self.hkv, self.d = cfg, hq, hkv, d
        self.q_proj = nn.Linear(h, hq * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, hkv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, hkv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(hq * d, h, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x: Tensor, positions: Tensor, rope: tuple[Tensor, float],
                cache: LayerCache) -> tuple[Tensor, LayerCache]:
        """x [B, T, H] -> [B, T, H]; cache k/v [B, Hkv, S-T, D] -> [B, Hkv, S, D]."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.hq, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.hkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.hkv, self.d).transpose(1, 2)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        inv_freq, rope_scale = rope
        q = torch.ops.arkinfer.rope(q, positions, inv_freq, rope_scale)
        k = torch.ops.arkinfer.rope(k, positions, inv_freq, rope_scale)
        k_all = torch.cat([cache[0], k], dim=2)
        v_all = torch.cat([cache[1], v], dim=2)
        out = self.attend(q, k_all, v_all)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.hq * self.d)), (k_all, v_all)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q [B, Hq, T, D], k/v [B, Hkv, S, D] -> [B, Hq, T, D]; causal, queries are the last T."""
        window = self.cfg.sliding_window
        if window is not None and k.shape[2] > window:
            raise ConfigError(f"sequence of {k.shape[2]} tokens exceeds sliding_window={window}, "
                              "which ArkInfer does not implement", hint=f"keep prompts under {window}")
        return torch.ops.arkinfer.attention(q, k, v, 1.0 / math.sqrt(self.d))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.arkinfer.rms_norm(x, self.weight, self.eps)


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, attention_cls: type[Attention]) -> None:
        super().__init__()
        self.residual_scale = cfg.residual_scale
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = attention_cls(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, h: Tensor, positions: Tensor, rope: tuple[Tensor, float],
                cache: LayerCache) -> tuple[Tensor, LayerCache]:
        attn, cache = self.self_attn(self.input_layernorm(h), positions, rope, cache)
        h = h + attn * self.residual_scale
        h = h + self.mlp(self.post_attention_layernorm(h)) * self.residual_scale
        return h, cache


class Backbone(nn.Module):
    def __init__(self, cfg: LlamaConfig, attention_cls: type[Attention]) -> None:
        super().__init__()
        # Weights always come from a checkpoint: no random init (normal_ over V x H costs
        # seconds for large vocabularies, and on the meta device it imports torch._dynamo).
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.zeros(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg, attention_cls)
                                    for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """The reference model. `forward(ids, positions, cache) -> (logits fp32, cache)`."""

    attention_cls: type[Attention] = Attention

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg, self.attention_cls)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def empty_cache(self, batch: int = 1) -> list[LayerCache]:
        """Zero-length cache for every layer, in the model's dtype."""
        p = self.model.embed_tokens.weight
        cfg = self.config
        shape = (batch, cfg.num_key_value_heads, 0, cfg.head_dim)
        return [(p.new_zeros(shape), p.new_zeros(shape)) for _ in range(cfg.num_hidden_layers)]

    @torch.no_grad()
    def rope_is_finite(self, positions: Tensor) -> bool:
        """Whether the RoPE tables of a call at `positions` [T] are finite: the rope op applied to
        ones at the first and last position (angle = position x frequency grows with the
        position, and 0 x inf is NaN at position 0). A config value can make them NaN/inf
        (rope_theta 0, a tiny rope_scaling factor), and the fused attention may then hide it."""
        ends = torch.stack([positions.min(), positions.max()])
        inv_freq, scale = self.config.inv_freq(int(ends[1]) + 1)
        ones = torch.ones(1, 1, 2, self.config.head_dim)
        return bool(torch.isfinite(torch.ops.arkinfer.rope(ones, ends, inv_freq, scale)).all())

    def forward(self, input_ids: Tensor, positions: Tensor, cache: list[LayerCache]
                ) -> tuple[Tensor, list[LayerCache]]:
        """input_ids [B, T] int64, positions [T] int64 (absolute, = S-T..S-1) -> logits [B, T, V] fp32."""
        cfg = self.config
        total = cache[0][0].shape[2] + input_ids.shape[1] if cache else input_ids.shape[1]
        rope = self.config.inv_freq(total)
        h = self.model.embed_tokens(input_ids) * cfg.embedding_scale
        new_cache = []
        for layer, layer_cache in zip(self.model.layers, cache):
            h, layer_cache = layer(h, positions, rope, layer_cache)
            new_cache.append(layer_cache)
        h = self.model.norm(h)
        if cfg.logit_divisor != 1.0:
            h = h / cfg.logit_divisor
        return self.lm_head(h).float(), new_cache


def expected_weights(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor names and shapes the model needs (tied lm_head excluded)."""
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)
    return shapes


MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
ConfigClass = LlamaConfig
ModelClass = LlamaForCausalLM
