"""`arkinfer plan`: will MODEL run on TARGET with QUANT, and how fast — from config.json and
safetensors headers alone.

    plan = make_plan("minicpm4.1-8b", "jetson-orin", "int4")
    plan.rows          # one Prediction per (context, attention): dense, and InfLLM v2 when the
                       # config has sparse_config and the backend runs it here (its
                       # capabilities: gguf only once the InfLLM v2 llama.cpp is built)
    plan.refusal()     # an ArkError with the numbers when it does not fit at the smallest context

`--quant` is resolved by `arkinfer.resolve`, the resolver `build` uses too (aliases, `int4`, the
backend choice and the preset fitted to the model's shapes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from arkinfer.backend import get_backend
from arkinfer.errors import ArkError
from arkinfer.latency.cost import ModelCost
from arkinfer.latency.predict import Prediction, predict
from arkinfer.latency.source import ModelSource, load_source
from arkinfer.quant.recipe import PRESETS
from arkinfer.resolve import FLOAT_SCHEMES, resolve, takes

CONTEXTS = (4096, 32768, 131072)


@dataclass
class Plan:
    """Everything `arkinfer plan` prints (see `as_dict`)."""

    source: ModelSource
    target: Any
    backend: str
    quant: str
    requested_quant: str
    cost: ModelCost
    contexts: tuple[int, ...]
    rows: list[Prediction]
    sparse_supported: bool | None  # None: the config has no sparse_config; else whether the
                                   # backend runs InfLLM v2 here (`Capabilities.runs_infllmv2`)
    notes: list[str] = field(default_factory=list)

    def ops(self) -> list[tuple[str, str]]:
        """(op, implementation on this backend) for the model's ops."""
        cfg, b = self.cost.config, self.backend
        rope = (cfg.rope_scaling or {}).get("rope_type", (cfg.rope_scaling or {}).get("type"))
        linears = [t for t in self.cost.tensors if t.role == "linear"]
        formats = sorted({t.storage.fmt for t in linears})
        kept = sum(1 for t in linears if t.storage.kind == "float" and self.cost.recipe)
        emb = next((t.storage.fmt for t in self.cost.tensors if t.role == "embedding"), "?")
        head = next((t for t in self.cost.tensors if t.role == "lm_head"), None)
        ops = [("embedding", f"lookup ({emb})"),
               ("linear", f"{', '.join(formats)} on {b}"
                + (f" ({kept} of {len(linears)} kept in float)" if kept else "")),
               ("lm_head", f"tied to the embedding ({emb})" if head is None else
                f"{head.storage.fmt}" + (f" ({head.storage.reason})" if head.storage.reason
                                         else "")),
               ("rms_norm", "fp32"), ("rope", rope or "default"), ("silu * mul", "elementwise")]
        att = f"dense GQA ({cfg.num_attention_heads} q / {cfg.num_key_value_heads} kv heads)"
        if self.cost.sparse is not None:
            sc = self.cost.sparse
            if self.sparse_supported:
                att += (f"; InfLLM v2 from {sc.dense_len} tokens (topk {sc.topk} + window "
                        f"{sc.window_size}: {sc.full_visibility_len} keys per query)")
            else:
                att += (f"; InfLLM v2 not on {b}: "
                        f"{get_backend(b).capabilities.dense_reason()}")
        ops.insert(2, ("attention", att))
        return ops

    def smallest_fit(self) -> Prediction:
        """The row with the least memory at the smallest context."""
        first = [p for p in self.rows if p.ctx == min(self.contexts)]
        return min(first, key=lambda p: p.memory.total)

    def refusal(self) -> ArkError | None:
        """An error with the numbers when the model does not fit even at the smallest context."""
        p = self.smallest_fit()
        if p.fits:
            return None
        m = p.memory
        gb = 1e9
        alternatives = fitting_alternatives(self)
        return ArkError(
            f"{self.cost.quant} does not fit {self.target.id} ({m.device / 2**30:.3g} GiB): it needs "
            f"{m.total / gb:.2f} GB at {p.ctx} tokens = weights {m.weights / gb:.2f} GB + KV "
            f"{(m.kv_cache + m.compressed_keys) / gb:.2f} GB + workspace {m.workspace / gb:.2f} GB",
            hint=(f"these fit: {alternatives}" if alternatives else
                  "no quant scheme of this target fits; pick a smaller model or a bigger device"))

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.source.label, "target": self.target.id, "backend": self.backend,
                "quant": self.quant, "requested_quant": self.requested_quant,
                "cost": self.cost.as_dict(), "contexts": list(self.contexts),
                "sparse_supported": self.sparse_supported,
                "target_formats": {n: {"quant_formats": list(b.quant_formats),
                                       "dtypes": [str(d) for d in b.dtypes]}
                                   for n, b in self.target.backends.items()},
                "ops": dict(self.ops()),
                "predictions": [p.as_dict() for p in self.rows],
                "fits": self.smallest_fit().fits, "notes": self.notes}


def fitting_alternatives(plan: Plan) -> str:
    """Schemes of the plan's backend that fit at the smallest context, largest first."""
    schemes = [q for q in (*FLOAT_SCHEMES, *PRESETS) if takes(plan.target, plan.backend, q)]
    ctx = min(plan.contexts)
    found = []
    for q in schemes:
        if q == plan.quant:
            continue
        fitted = resolve(q, plan.source.raw_config, plan.target, plan.backend).recipe
        cost = ModelCost.from_config(plan.source.raw_config, fitted or q, plan.source.headers,
                                     source=plan.cost.source)
        p = predict(cost, plan.target, ctx=ctx, prompt=ctx)
        if p.fits:
            found.append((p.memory.total, f"{q} ({p.memory.total / 1e9:.2f} GB)"))
    return ", ".join(text for _, text in sorted(found, reverse=True))


def make_plan(model: str, target: Any, quant: str, backend: str | None = None,
              contexts: tuple[int, ...] = CONTEXTS) -> Plan:
    """Plan `model` (name, config.json or folder) on `target` (id, alias, path or Target)."""
    from arkinfer.targets import load_target

    tgt = load_target(target) if isinstance(target, str) else target
    if tgt.measured_at_runtime and tgt.bandwidth is None:
        from arkinfer.targets.host import host_target

        tgt = host_target()
    source = load_source(model)
    r = resolve(quant, source.raw_config, tgt, backend)  # the same resolver as `build`
    name, scheme = r.backend, r.scheme
    cost = ModelCost.from_config(source.raw_config, r.recipe or scheme, source.headers,
                                 source=source.label.split(" (")[0])
    sparse_ok = None if cost.sparse is None else get_backend(name).capabilities.runs_infllmv2()
    modes = ["dense", "sparse"] if sparse_ok else ["dense"]
    rows = [predict(cost, tgt, ctx=c, prompt=c, attention=a) for c in contexts for a in modes]
    notes = list(r.notes)
    max_pos = cost.config.max_position_embeddings
    notes += [f"{c} tokens exceed the config's max_position_embeddings ({max_pos})"
              for c in contexts if c > max_pos]
    if tgt.peak_compute is None:
        notes.append(f"{tgt.id} has no compute peak: only decode (bandwidth-bound) is predicted")
    kept = cost.float_layers()
    notes += [f"{t.name} stays {t.storage.fmt}: {t.storage.reason}" for t in kept[:3]]
    if len(kept) > 3:
        notes.append(f"... and {len(kept) - 3} more layers kept in float")
    return Plan(source, tgt, name, scheme, quant, cost, tuple(contexts), rows, sparse_ok, notes)
