"""Tracing a reference model into a Program: torch.export of `prefill` and `decode`, then lowering.

    prefill(tokens [B,T], positions [T], cache [B,Hkv,P,D] x 2L)   T in [1, max_len], P in [0, max_len)
    decode(tokens [B,1], positions [1], cache [B,Hkv,S,D] x 2L)     S in [0, max_len)

Both are exported with `torch.export.export(strict=False)` and `Dim`s for T, P and S, so one graph
serves every length. Three pieces of the reference model branch on lengths in Python, which
export would turn into guards; during tracing the model sees a stand-in config that keeps them
out of the way (the model object is restored afterwards):

- LongRoPE's short/long factors (`total > original_max_position_embeddings`): `inv_freq` returns
  the op `arkinfer_ir::longrope_select`, lowered to the rope op's `long_after`/`length`
  attributes, so the choice is made in the graph for each call's total length. When the two
  factor lists are equal (MiniCPM4.1) there is no choice and one table is used.
- InfLLM v2's dense/sparse switch (`total < dense_len`): the dense op is traced and the
  `sparse_config` goes on every IR attention node, whose meaning includes the switch.
- The sliding-window check (Mistral): becomes the graph constraint `P+T <= window`.

RoPE frequencies are computed once, outside the graph, and enter it as the buffers
`rope.inv_freq` (and `rope.inv_freq_long`): weights in the store, like every parameter.

Shape-only tracing: a model on the `meta` device (built from config.json alone) traces the same
way — MiniCPM4.1-8B in seconds and a few hundred MB — and yields a program whose weights have
types but no data (enough to print, verify, plan and serialise the graph).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.export import Dim

from arkinfer import models
from arkinfer.ir import _trace_ops  # noqa: F401 - registers arkinfer_ir::longrope_select
from arkinfer.ir.errors import TraceError
from arkinfer.ir.graph import ENTRY_POINTS, Program
from arkinfer.ir.lower_aten import EntrySpec, lower
from arkinfer.ir.types import DType, TensorType
from arkinfer.ir.verify import verify
from arkinfer.ir.weights import Weight, WeightStore

Loader = Callable[[], Tensor]
_EXAMPLE = {"prefill": (7, 5), "decode": (1, 6)}  # (T, cache length) of the example inputs


class _Entry(nn.Module):
    """prefill/decode as one module: (tokens, positions, cache pairs) -> (logits, cache pairs)."""

    def __init__(self, model: nn.Module, short: Tensor, long: Tensor | None, threshold: int):
        super().__init__()
        self.model, self.threshold = model, threshold
        device = next(model.parameters()).device
        self.register_buffer("rope_inv_freq", short.to(device))
        self.register_buffer("rope_inv_freq_long", None if long is None else long.to(device))

    def inv_freq(self, total: Any) -> Tensor:
        if self.rope_inv_freq_long is None:
            return self.rope_inv_freq
        return torch.ops.arkinfer_ir.longrope_select(self.rope_inv_freq, self.rope_inv_freq_long,
                                                     total, self.threshold)

    def forward(self, tokens: Tensor, positions: Tensor, cache: list[tuple[Tensor, Tensor]]):
        logits, new_cache = self.model(tokens, positions, cache)
        return logits, [tuple(pair) for pair in new_cache]


class _TracingConfig:
    """The model's config, except for the three length-dependent choices (see module docstring)."""

    sliding_window = None
    dense_len = None
    sparse_config = None  # attention modules trace their dense path; the IR node gets the config

    def __init__(self, config: Any, entry: _Entry, scale: float) -> None:
        self._config, self._entry, self._scale = config, entry, scale

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)

    def inv_freq(self, total_len: Any) -> tuple[Tensor, float]:
        return self._entry.inv_freq(total_len), self._scale


def rope_tables(config: Any) -> tuple[Tensor, Tensor | None, int, float]:
    """(short inv_freq, long inv_freq or None when there is no choice, switch length, scale)."""
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) != "longrope":
        short, scale = config.inv_freq(1)
        return short, None, 0, scale
    orig = int(scaling.get("original_max_position_embeddings", config.max_position_embeddings))
    (short, scale), (long, long_scale) = config.inv_freq(orig), config.inv_freq(orig + 1)
    if scale != long_scale:
        raise TraceError(f"LongRoPE attention scale differs between short ({scale}) and long "
                         f"({long_scale}) factors", hint="this config is not supported by the IR")
    return short, (None if torch.equal(short, long) else long), orig, scale


def max_length(config: Any) -> int:
    """Longest total length (cache + new tokens) the program accepts."""
    limit = int(config.max_position_embeddings)
    window = getattr(config, "sliding_window", None)
    return min(limit, int(window)) if window else limit


def _resolve(source: Any, dtype: torch.dtype | None, shape_only: bool
             ) -> tuple[Any, nn.Module, Callable[[str], Loader | None]]:
    """(config, model, name -> loader) for a model, a config dict or a checkpoint folder."""
    if isinstance(source, nn.Module):
        if not hasattr(source, "config") or not hasattr(source.config, "inv_freq"):
            raise TraceError(f"{type(source).__name__} is not an ArkInfer reference model "
                             "(it has no .config with inv_freq)",
                             hint="build it with arkinfer.models.build_model or load a checkpoint")
        if dtype is not None:
            raise TraceError("dtype= applies to configs and folders; cast the model instead")
        return source.config, source, lambda name: None
    from arkinfer.frontend.checkpoint import (
        check_weights,
        read_config,
        resolve_model_path,
    )

    folder = None
    if isinstance(source, dict):
        raw = source
    else:
        folder = resolve_model_path(str(source))
        raw = read_config(folder)
    config = models.parse_config(raw, "config.json" if folder is None else str(folder / "config.json"))
    if dtype is None:
        dtype = getattr(torch, str(raw.get("torch_dtype", "float32")), torch.float32)
    with torch.device("meta"):
        model = models.build_model(config).to(dtype).eval()
    if folder is None or shape_only:
        return config, model, lambda name: None
    from arkinfer.frontend.safetensors_io import LazyWeights, weight_files

    lazy = LazyWeights(weight_files(folder))
    check_weights(models.module_for(raw).expected_weights(model), lazy, folder)
    return config, model, lambda name: (lambda: lazy.get(name).to(dtype)) if name in lazy else None


def _spec(entry: str, config: Any, names: dict[str, str], sparse: dict | None
          ) -> tuple[EntrySpec, dict]:
    """How to name the export of `entry`, and its dynamic_shapes."""
    layers, max_len = config.num_hidden_layers, max_length(config)
    cache = [(f"cache.{i}.k", f"cache.{i}.v") for i in range(layers)]
    flat_cache = [n for pair in cache for n in pair]
    if entry == "prefill":
        t, p = Dim("T", min=1, max=max_len), Dim("P", min=0, max=max_len - 1)
        dyn = {"tokens": {1: t}, "positions": {0: t}, "cache": [({2: p}, {2: p})] * layers}
        named = {"tokens": {1: "T"}, "positions": {0: "T"}, **{n: {2: "P"} for n in flat_cache}}
        ranges, constraints = {"T": (1, max_len), "P": (0, max_len - 1)}, [("P+T", max_len)]
    else:
        s = Dim("S", min=0, max=max_len - 1)
        dyn = {"tokens": None, "positions": None, "cache": [({2: s}, {2: s})] * layers}
        named = {n: {2: "S"} for n in flat_cache}
        ranges, constraints = {"S": (0, max_len - 1)}, [("S+1", max_len)]
    spec = EntrySpec(entry, ["tokens", "positions", *flat_cache], ["logits", *flat_cache], named,
                     ranges, constraints, names, sparse)
    return spec, dyn


def _weight_store(model: nn.Module, rope: dict[str, Tensor | None],
                  loader_for: Callable[[str], Loader | None]) -> WeightStore:
    """Every parameter and buffer (tied ones once, under their first name) plus the RoPE tables.

    Data: the checkpoint's lazy loader when there is one, else the model's own tensor (shared,
    not copied; a meta tensor when shape-only). The RoPE frequencies are always real."""
    store = WeightStore()
    for name, tensor in [*model.named_parameters(), *model.named_buffers(), *rope.items()]:
        if tensor is None:
            continue
        loader = loader_for(name)
        store.add(Weight(name, TensorType.of(tensor), data=None if loader else tensor.detach(),
                         loader=loader))
    return store


def _export_names(model: nn.Module) -> dict[str, str]:
    """torch.export parameter/buffer target (on the _Entry wrapper) -> weight store name."""
    names = {"rope_inv_freq": "rope.inv_freq", "rope_inv_freq_long": "rope.inv_freq_long"}
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names["model." + name] = first.setdefault(id(p), name)  # tied weights: the first name
    for name, _ in model.named_buffers():
        names["model." + name] = name
    return names


def trace(source: Any, *, dtype: torch.dtype | None = None, batch: int = 1, dense: bool = False,
          shape_only: bool = False, entries: tuple[str, ...] = ENTRY_POINTS) -> Program:
    """The IR Program of a reference model, a checkpoint folder (or 'demo') or a config.json dict.

    A model's tensors are shared with the program, not copied. Folders load no tensor data:
    weights are read lazily on first use (`shape_only=True`, or a config dict: no data at all).
    `dtype` (configs and folders only) defaults to config.json's torch_dtype. `dense=True` (or
    a model with `set_dense(True)`) drops sparse_config from the attention nodes.
    """
    config, model, loader_for = _resolve(source, dtype, shape_only)
    unknown = [e for e in entries if e not in ENTRY_POINTS]
    if unknown or batch < 1:
        raise TraceError(f"entries {unknown} / batch {batch} not supported",
                         hint=f"entries are {ENTRY_POINTS}; batch >= 1")
    short, long, threshold, scale = rope_tables(config)
    wrapper = _Entry(model, short, long, threshold)
    dense = dense or any(getattr(m, "force_dense", False) for m in model.modules())
    sparse = None if dense else getattr(config, "sparse_config", None)
    store = _weight_store(model, {"rope.inv_freq": short, "rope.inv_freq_long": long}, loader_for)
    names = _export_names(model)
    swapped = [(m, attr, getattr(m, attr)) for m in model.modules() for attr in ("config", "cfg")
               if getattr(m, attr, None) is config]
    stand_in = _TracingConfig(config, wrapper, scale)
    graphs = {}
    try:
        for m, attr, _ in swapped:
            setattr(m, attr, stand_in)
        for entry in entries:
            spec, dyn = _spec(entry, config, names, sparse)
            graphs[entry] = lower(_export(wrapper, config, entry, batch, dyn), spec, store)
    finally:
        for m, attr, original in swapped:
            setattr(m, attr, original)
    model_dtype = DType.from_torch(next(model.parameters()).dtype)
    return verify(Program(graphs, store, program_meta(config, model_dtype, batch, dense)))


def _export(wrapper: _Entry, config: Any, entry: str, batch: int, dyn: dict):
    t, s = _EXAMPLE[entry]
    p = next(wrapper.model.parameters())
    shape = (batch, config.num_key_value_heads, s, config.head_dim)
    cache = [(torch.zeros(shape, dtype=p.dtype, device=p.device),
              torch.zeros(shape, dtype=p.dtype, device=p.device))
             for _ in range(config.num_hidden_layers)]
    tokens = torch.zeros(batch, t, dtype=torch.long, device=p.device)
    positions = torch.arange(s, s + t, device=p.device)
    try:
        return torch.export.export(wrapper, (tokens, positions, cache), dynamic_shapes=dyn,
                                   strict=False)
    except torch._dynamo.exc.UserError as exc:  # constraint violations: a length-dependent branch
        raise TraceError(f"torch.export could not trace '{entry}' for every length: {exc}",
                         hint="some code in the model branches on the sequence or cache length; "
                         "move the choice into an op (see arkinfer/ir/tracing.py)") from None


def program_meta(config: Any, dtype: DType, batch: int, dense: bool) -> dict[str, Any]:
    """JSON-able facts a backend needs beside the graphs."""
    raw = dict(getattr(config, "raw", {}) or {})
    return {
        "model_type": config.model_type,
        "architectures": raw.get("architectures", []),
        "dtype": dtype.value,
        "batch": batch,
        "max_len": max_length(config),
        "vocab_size": config.vocab_size,
        "num_kv_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "cache": [[f"cache.{i}.k", f"cache.{i}.v"] for i in range(config.num_hidden_layers)],
        "cache_layout": "[B,Hkv,S,D]",
        "sparse_config": None if dense else getattr(config, "sparse_config", None),
        "config": raw,
    }

