"""The roofline latency model of docs/targets.md, batch 1, on one target profile.

    p = predict(cost, target, ctx=4096, prompt=512, attention="sparse")
    p.decode_tok_s, p.prefill_tok_s, p.ttft_s, p.bound, p.fits, p.as_dict()

Every step time is `max(bytes / (η_bw · BW), flops / (η_c · peak))` (no other overheads):

- decode with `ctx` cached tokens: bytes = `cost.weight_bytes_step` + KV read
  (`cost.kv_read_bytes`: dense, or InfLLM v2 once ctx + 1 >= dense_len); flops = 2 · active
  parameters + attention 4 · layers · heads · head_dim · keys seen (+ 2 · layers · heads ·
  head_dim · compressed keys for InfLLM v2 scoring).
- prefill of `prompt` tokens after `depth` cached ones: bytes = weights read once + T embedding
  rows + KV of depth + T tokens; flops = 2 · block-linear parameters · T + 2 · lm_head parameters
  (the last token's logits) + attention 4 · layers · heads · head_dim · Σ keys seen per query
  (= 2 · layers · heads · head_dim · T² dense causal from an empty cache; each query sees at most
  `visible` = 6144 keys under InfLLM v2, which runs when depth + T >= dense_len, plus scoring).
  TTFT = prefill time (the first token comes from the prefill logits).

Memory fit: weights + KV cache of max(ctx, depth + prompt) tokens (+ compressed keys when
InfLLM v2 runs) + workspace (fp32 activations of one 512-token prefill chunk, the logits row, and
a 512 MiB runtime reserve — both assumed) against the device's memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from arkinfer.errors import ConfigError, TargetError
from arkinfer.latency.cost import ModelCost

Attention = Literal["dense", "sparse"]
Bound = Literal["bandwidth", "compute"]
PREFILL_CHUNK = 512  # tokens per prefill chunk (llama.cpp's default ubatch)
RUNTIME_RESERVE = 512 * 2**20  # CUDA context / runtime buffers / OS share: an assumption
ACT_BYTES = 4  # activations in fp32


@dataclass(frozen=True)
class Step:
    """One roofline evaluation: bytes moved, FLOPs, the two times and the larger one."""

    bytes: float
    flops: float
    t_bandwidth: float
    t_compute: float | None  # None when the target has no compute peak
    seconds: float
    bound: Bound

    def as_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "flops": self.flops, "t_bandwidth_s": self.t_bandwidth,
                "t_compute_s": self.t_compute, "seconds": self.seconds, "bound": self.bound}


@dataclass(frozen=True)
class MemoryFit:
    """Bytes needed against the device's memory."""

    weights: int
    kv_cache: int
    compressed_keys: int
    workspace: int
    device: float
    tokens: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compressed_keys + self.workspace

    @property
    def fits(self) -> bool:
        return self.total <= self.device

    def as_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "weights": self.weights, "kv_cache": self.kv_cache,
                "compressed_keys": self.compressed_keys, "workspace": self.workspace,
                "total": self.total, "device": self.device, "fits": self.fits,
                "headroom": self.device - self.total}


@dataclass(frozen=True)
class Prediction:
    """Predicted decode and prefill speed of `cost` on `target` (see the module docstring)."""

    target: str
    quant: str
    attention: Attention  # what was asked for
    decode_attention: Attention  # what runs at ctx (dense below dense_len)
    prefill_attention: Attention
    ctx: int
    prompt: int
    depth: int
    decode: Step
    prefill: Step | None  # None without a compute peak (prefill is compute-bound) or prompt
    memory: MemoryFit
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def decode_tok_s(self) -> float:
        return 1.0 / self.decode.seconds

    @property
    def bound(self) -> Bound:
        """What limits decode."""
        return self.decode.bound

    @property
    def ttft_s(self) -> float | None:
        return None if self.prefill is None else self.prefill.seconds

    @property
    def prefill_tok_s(self) -> float | None:
        return None if self.prefill is None else self.prompt / self.prefill.seconds

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "quant": self.quant, "attention": self.attention,
                "decode_attention": self.decode_attention,
                "prefill_attention": self.prefill_attention, "ctx": self.ctx,
                "prompt": self.prompt, "depth": self.depth,
                "decode_tok_s": self.decode_tok_s, "prefill_tok_s": self.prefill_tok_s,
                "ttft_s": self.ttft_s, "bound": self.bound,
                "decode": self.decode.as_dict(),
                "prefill": None if self.prefill is None else self.prefill.as_dict(),
                "memory": self.memory.as_dict(), "inputs": self.inputs}


def _roofline(nbytes: float, flops: float, bw: float, peak: float | None) -> Step:
    t_bw = nbytes / bw
    t_c = None if peak is None else flops / peak
    if t_c is not None and t_c > t_bw:
        return Step(nbytes, flops, t_bw, t_c, t_c, "compute")
    return Step(nbytes, flops, t_bw, t_c, t_bw, "bandwidth")


def roofline_step(target: Any, nbytes: float, flops: float) -> Step:
    """The roofline time of reading `nbytes` and computing `flops` on `target` (its effective
    bandwidth and peak, as a decode step is predicted)."""
    bw, peak, _ = _target_numbers(target)
    return _roofline(nbytes, flops, bw, peak)


def _sum_min(lo: int, hi: int, cap: int) -> int:
    """Σ_{p=lo}^{hi} min(p, cap) for integers 0 <= lo <= hi (0 when hi < lo)."""
    if hi < lo:
        return 0
    def tri(a: int, b: int) -> int:  # Σ_{p=a}^{b} p
        return (a + b) * (b - a + 1) // 2 if b >= a else 0
    if hi <= cap:
        return tri(lo, hi)
    if lo > cap:
        return cap * (hi - lo + 1)
    return tri(lo, cap) + cap * (hi - cap)


def _floor_sum(n: int, s: int) -> int:
    """Σ_{p=0}^{n} floor(p / s) (0 for n < 0)."""
    if n < 0:
        return 0
    q, r = divmod(n, s)
    return s * q * (q - 1) // 2 + q * (r + 1)


def attention_flops(cost: ModelCost, first: int, last: int, sparse: bool) -> float:
    """FLOPs of attention for the queries at positions first..last (a query at p sees p keys,
    itself included): 4 · layers · heads · head_dim per key seen (QK and PV); under InfLLM v2 a
    query sees min(p, visible) keys and also scores its p/16 + p/64 compressed keys at
    2 · layers · heads · head_dim each."""
    cfg = cost.config
    per_key = 2 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim
    if not sparse:
        return 2 * per_key * _sum_min(first, last, last)
    stride = cost.sparse.kernel_stride
    scored = sum(_floor_sum(last, s) - _floor_sum(first - 1, s) for s in (stride, 4 * stride))
    return 2 * per_key * _sum_min(first, last, cost.visible_keys) + per_key * scored


def _target_numbers(target: Any) -> tuple[float, float | None, dict[str, Any]]:
    """(η_bw · BW, η_c · peak or None, inputs with provenance); TargetError when unmeasured."""
    if target.bandwidth is None or target.eta_bw is None or target.memory is None:
        raise TargetError(f"target '{target.id}' has no bandwidth or memory numbers yet",
                          hint="run `arkinfer doctor` to measure this machine (host_target())"
                          if target.measured_at_runtime else "add them to the profile")
    inputs = {"bandwidth": target.bandwidth.to_dict(), "eta_bw": target.eta_bw.to_dict(),
              "memory": target.memory.to_dict(), "roofline": target.roofline}
    peak = target.peak_compute
    eff_peak = None
    if peak is not None and target.eta_c is not None:
        eff_peak = peak.value * target.eta_c.value
        inputs.update(peak=peak.to_dict(), eta_c=target.eta_c.to_dict())
    inputs["effective_bandwidth"] = target.bandwidth.value * target.eta_bw.value
    inputs["effective_peak"] = eff_peak
    return inputs["effective_bandwidth"], eff_peak, inputs


def workspace_bytes(cost: ModelCost, prompt: int) -> int:
    """fp32 activations of one prefill chunk (≤ 512 tokens) through the widest layer — residual,
    q, k, v, attention output, gate, up — plus the logits row and the runtime reserve."""
    cfg = cost.config
    chunk = max(1, min(prompt, PREFILL_CHUNK))
    q = cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    width = cfg.hidden_size + 2 * q + 2 * kv + 2 * cfg.intermediate_size
    return chunk * width * ACT_BYTES + cfg.vocab_size * ACT_BYTES + RUNTIME_RESERVE


def predict(cost: ModelCost, target: Any, *, ctx: int = 4096, prompt: int = 512, depth: int = 0,
            attention: Attention = "dense") -> Prediction:
    """Decode speed at `ctx` cached tokens, prefill / TTFT of `prompt` tokens after `depth`
    cached ones (none when prompt=0), and memory fit, on `target` (a `Target` with numbers; see
    `host_target`). attention="sparse" runs InfLLM v2 where the config allows it (see module)."""
    if attention not in ("dense", "sparse"):
        raise ConfigError(f"attention={attention!r}; allowed: dense, sparse",
                          hint="sparse (InfLLM v2) needs a config with sparse_config")
    if attention == "sparse" and cost.sparse is None:
        raise ConfigError(f"attention='sparse' but {cost.source} has no sparse_config",
                          hint="use attention='dense', or add sparse_config (docs/infllmv2.md)")
    if ctx < 0 or prompt < 0 or depth < 0:
        raise ConfigError(f"ctx={ctx}, prompt={prompt}, depth={depth}: token counts must not be "
                          "negative", hint="prompt=0 predicts decode only")
    bw, peak, inputs = _target_numbers(target)
    cfg = cost.config

    # decode: one new token attends to ctx cached keys plus itself
    d_sparse = attention == "sparse" and cost.sparse_at(ctx + 1)
    d_bytes = cost.weight_bytes_step + cost.kv_read_bytes(ctx, d_sparse)
    d_flops = 2 * cost.params_active + attention_flops(cost, ctx + 1, ctx + 1, d_sparse)
    decode = _roofline(d_bytes, d_flops, bw, peak)

    # prefill: prompt tokens at positions depth+1 .. depth+prompt, one call
    total = depth + prompt
    p_sparse = attention == "sparse" and cost.sparse_at(total)
    p_bytes = (cost.weight_bytes_step + (prompt - 1) * cost.embedding_row_bytes
               + cost.kv_bytes_per_token * total)
    p_flops = (2 * cost.params_linear * prompt + 2 * cost.params_lm_head
               + attention_flops(cost, depth + 1, total, p_sparse))
    prefill = None if peak is None or prompt == 0 else _roofline(p_bytes, p_flops, bw, peak)

    tokens = max(ctx, total)
    keep_compressed = attention == "sparse" and cost.sparse_at(tokens)
    memory = MemoryFit(cost.weight_bytes, cost.kv_bytes_per_token * tokens,
                       cost.compressed_key_bytes(tokens) if keep_compressed else 0,
                       workspace_bytes(cost, prompt), target.memory.value, tokens)
    inputs["model"] = {"params_active": cost.params_active, "params_linear": cost.params_linear,
                       "params_lm_head": cost.params_lm_head,
                       "weight_bytes_step": cost.weight_bytes_step,
                       "kv_bytes_per_token": cost.kv_bytes_per_token,
                       "layers": cfg.num_hidden_layers, "heads": cfg.num_attention_heads,
                       "head_dim": cfg.head_dim, "visible_keys": cost.visible_keys,
                       "dense_len": None if cost.sparse is None else cost.sparse.dense_len}
    return Prediction(target.id, cost.quant, attention, "sparse" if d_sparse else "dense",
                      "sparse" if p_sparse else "dense", ctx, prompt, depth, decode, prefill,
                      memory, inputs)
