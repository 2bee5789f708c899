"""`arkinfer plan MODEL --target T --quant Q` — memory fit and predicted speed, before any build.

Reads config.json and safetensors headers only (arkinfer/latency/source.py), so it plans an 8B
model in seconds, from a bare config.json or a built-in config name too.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.table import Table

from arkinfer.cli._errors import handle_errors, report
from arkinfer.cli._options import BackendOpt, JsonOpt, QuantOpt, TargetOpt
from arkinfer.cli._output import (
    console,
    print_json,
    print_kv,
    print_table,
    terminal_safe,
)
from arkinfer.latency.plan import CONTEXTS, Plan, make_plan
from arkinfer.latency.predict import Prediction
from arkinfer.latency.speculative import (
    DEFAULT_ACCEPTANCE,
    DEFAULT_K,
    SpeculativePrediction,
)

HELP = ("Plan a deployment from config.json (and safetensors headers) alone: weight bytes per "
        "format, KV cache per token, memory fit at 4K / 32K / 128K tokens, what the target's "
        "backend runs, and predicted TTFT and decode tokens/s, dense and with InfLLM v2 (the "
        "roofline of docs/targets.md). Exits non-zero, with the numbers, when it does not fit.")
EXAMPLES = [
    "arkinfer plan minicpm4.1-8b --target jetson-orin --quant int4",
    "arkinfer plan minicpm4.1-8b --target rpi5 --quant fp16",
    "arkinfer plan ./MiniCPM4.1-8B/config.json --target apple-m4-pro --quant mlx4 --json",
    "arkinfer plan demo --target host --quant q4_0 -c 512 -c 2048",
    "arkinfer plan minicpm4.1-8b --target jetson-orin --quant int4 --speculative",
    ("arkinfer plan demo --target host --quant q4_0 --speculative --acceptance 0.8 --draft-k 6 "
     "--draft-layers 2"),
    "arkinfer plan minicpm4.1-8b --target jetson-orin --quant marlin --speculative --draft-vocab 32768",
    "arkinfer plan ./MiniCPM4.1-8B --target jetson-orin --quant marlin --samples 8 --seq-len 256",
    ("arkinfer plan ./MiniCPM4.1-8B --target jetson-orin --quant marlin --samples 128 "
     "--seq-len 2048 --gpu h100"),
]


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _tflop(flops: float) -> str:
    t = flops / 1e12
    return f"{t:,.0f} TFLOP" if t >= 1000 else f"{t:.3g} TFLOP"


def _ctx(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 and n >= 1024 else str(n)


def _secs(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s >= 3 * 3600:
        return f"{s / 3600:.1f}h"
    return f"{s:.3g}s" if s < 100 else f"{s:.0f}s" if s < 600 else f"{s / 60:.0f}min"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}" if x < 100 else f"{x:.0f}"


def _q(q) -> str:
    detail = q.derivation or q.measurement or q.source
    return f"{q.provenance}: {detail}"


def _print_header(plan: Plan) -> None:
    c, t = plan.cost, plan.target
    cfg = c.config
    b = t.backends[plan.backend]
    sparse = ("none" if c.sparse is None else
              f"InfLLM v2 from {c.sparse.dense_len} tokens" if plan.sparse_supported else
              f"InfLLM v2 in config, not run by {plan.backend}")
    role = c.as_dict()["weight_bytes_by_role"]
    print_kv(f"plan: {c.source} on {t.id}", [
        ("model", plan.source.label),
        ("architecture", (f"{c.as_dict()['architecture']}, {c.params / 1e9:.3g} B params, "
                         f"{cfg.num_hidden_layers} layers, {cfg.num_attention_heads} q / "
                         f"{cfg.num_key_value_heads} kv heads x {cfg.head_dim}, sparse: {sparse}")),
        ("target", f"{t.name}; memory {t.memory.value / 2**30:.3g} GiB"),
        ("backend", (f"{plan.backend}: formats {', '.join(b.quant_formats) or 'none'}; dtypes "
                    f"{', '.join(str(d) for d in b.dtypes)}")),
        ("quant", plan.quant + (f" ({c.recipe.describe()})" if c.recipe else " (float)")),
        ("weights", (f"{_gb(c.weight_bytes)}: linears {_gb(role['linear'])} "
                    f"({c.linear_bits_per_weight:.3g} bits/weight), lm_head {_gb(c.lm_head_bytes)}"
                    f"{' (tied)' if cfg.tie_word_embeddings else ''}, embedding "
                    f"{_gb(role['embedding'])}, other {_gb(role['other'])}")),
        ("read per token", f"{_gb(c.weight_bytes_step)} of weights + KV"),
        ("KV cache", f"{c.kv_bytes_per_token / 1024:g} KiB/token ({c.kv_elem_bytes}-byte elements)"
                     + ("" if c.sparse is None else
                        f"; InfLLM v2 compressed keys {c.compressed_key_bytes(1 << 20) / 2**20 / 1024:g}"
                        " KiB/token")),
        ("bandwidth", (f"{t.bandwidth.value / 1e9:.4g} GB/s x η_bw {t.eta_bw.value:g} "
                      f"({_q(t.bandwidth)}; η {t.eta_bw.provenance})")),
        ("compute", "unknown (decode only)" if t.peak_compute is None else
                    f"{t.peak_compute.value / 1e12:.4g} T{t.roofline} x η_c {t.eta_c.value:g} "
                    f"({_q(t.peak_compute)}; η {t.eta_c.provenance})"),
    ])


def _row(p: Prediction) -> list[str]:
    m = p.memory
    att = "dense" if p.attention == "dense" else (
        "sparse" if p.decode_attention == "sparse" else "sparse*")
    return [_ctx(p.ctx), att, f"{(m.kv_cache + m.compressed_keys) / 1e9:.2f}",
            f"{m.total / 1e9:.2f}", "yes" if m.fits else "NO", _secs(p.ttft_s),
            _rate(p.prefill_tok_s), _rate(p.decode_tok_s), p.bound]


def _print_rows(plan: Plan) -> None:
    table = Table(title="predicted, batch 1 (pp: prefill of a prompt as long as the context, "
                  "tg: decode at that context)",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                  header_style="bold")
    for col in ("ctx", "attention", "KV GB", "mem GB", "fits", "TTFT", "pp t/s", "tg t/s",
                "bound"):
        table.add_column(col, justify="left" if col in ("ctx", "attention") else "right",
                         no_wrap=True)
    for p in plan.rows:
        table.add_row(*_row(p))
    console.print(table)
    p = plan.rows[0]
    console.print(f"mem GB = weights {_gb(p.memory.weights)} + KV + workspace "
                  f"{_gb(p.memory.workspace)} (one 512-token prefill chunk + 512 MiB runtime "
                  f"reserve) vs {p.memory.device / 1e9:.2f} GB"
                  + ("; sparse = InfLLM v2, sparse* = dense below dense_len "
                     f"({plan.cost.sparse.dense_len} tokens)" if any(
                         r.attention == "sparse" and r.decode_attention == "dense"
                         for r in plan.rows) else ""), markup=False)


def _calibration_rows(c: dict, samples: int, seq_len: int, where: str) -> list[tuple[str, str]]:
    """The predicted calibration's time by phase and its peak memory (`where`: "here" or a
    GPU)."""
    ph, parts = c["seconds_by_phase"], c["peak_parts"]
    gpu = c.get("gpu")
    rate = (f"fp32 {c['matmul_flop_s'] / 1e12:.3g} TFLOP/s, vendor figure; efficiency fitted to "
            "one H200 run" if gpu else
            f"fp32 matmul {c['matmul_flop_s'] / 1e9:.3g} GFLOP/s, measured by `arkinfer doctor`")
    peak = (f"~{_gb(c['peak_bytes'])} peak"
            + (f" of the GPU's {_gb(c['gpu_memory_bytes'])}" if gpu else "")
            + (f" (at {c['peak_stage']})" if gpu else "")
            + f": block weights {_gb(parts['block_weights'])}, "
            f"activations {_gb(parts['activations'])}, GPTQ solve {_gb(parts['solve'])}"
            + ("" if gpu else f", process {_gb(parts['process'])}"))
    if gpu and c["peak_bytes"] > c["gpu_memory_bytes"]:
        peak += " — does not fit: lower --samples or --seq-len"
    time = (f"{samples} x {seq_len} tokens, {c['blocks']} blocks: "
            f"{_tflop(sum(c['flops'].values()))}, ~{_secs(c['seconds'])} {where} ({rate}): "
            f"forward {_secs(ph['forward'])}, Hessians {_secs(ph['hessian'])}, GPTQ "
            f"{_secs(ph['solve'])}, SNR reports {_secs(ph['report'])}")
    return [(f"calibration{' on ' + gpu if gpu else ''}", time),
            (f"calibration memory{' on ' + gpu if gpu else ''}", peak)]


def _print_build(build: dict, samples: int, seq_len: int) -> None:
    """The build's own cost on this machine, and on a named GPU with --gpu
    (arkinfer.pipeline.build_cost)."""
    rows = []
    for key, where in (("calibration", "here"), ("calibration_gpu", "there")):
        c = build.get(key)
        if c is None:
            continue
        rows += (_calibration_rows(c, samples, seq_len, where) if c["predicted"]
                 else [(key.replace("_", " on "), c["why"])])
    rows.append(("disk", (f"up to {_gb(build['disk_bytes'])} (artifact, quantised folder, "
                          "calibration work files)")))
    print_kv("building it (predicted)", rows)


def speculative_rows(plan: Plan, acceptance: float, k: int, layers: int | None,
                     draft_vocab: int | None = None) -> list[SpeculativePrediction]:
    """lookup, self:N (N = `layers`, default a quarter of the target's layers), an EAGLE-3 head
    and, with `draft_vocab`, the head with FR-Spec's K tokens, at the plan's smallest context,
    with InfLLM v2 where the plan runs it."""
    from arkinfer.latency.speculative import predict_speculative

    n = layers if layers is not None else max(1, plan.cost.layers // 4)
    attention = "sparse" if plan.sparse_supported else "dense"
    drafts = ["lookup", f"self:{n}", "eagle3"] + ([f"eagle3:{draft_vocab}"] if draft_vocab else [])
    return [predict_speculative(plan.cost, plan.target, draft, acceptance=acceptance, k=k,
                                ctx=min(plan.contexts), attention=attention)
            for draft in drafts]


def _print_speculative(rows: list[SpeculativePrediction], ctx: int, assumed: bool) -> None:
    table = Table(title=f"speculative decoding, predicted at {_ctx(ctx)} tokens",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                  header_style="bold")
    for col in ("draft", "A", "k", "E", "draft ms", "verify ms", "tg t/s", "speed-up"):
        table.add_column(col, justify="left" if col == "draft" else "right", no_wrap=True)
    for r in rows:
        table.add_row(r.draft, f"{r.acceptance:g}", str(r.k), f"{r.expected_tokens:.2f}",
                      f"{r.t_draft * 1000:.2f}", f"{r.t_verify * 1000:.2f}",
                      _rate(r.decode_tok_s), f"{r.speedup:.2f}x")
    console.print(table)
    console.print(("A (per-token acceptance) is assumed; measure it with `arkinfer bench "
                   "--speculative`. " if assumed else "") +
                  "E = (1 - A^(k+1)) / (1 - A) tokens per verify step; speed-up = E x decode "
                  "time / (k x draft time + verify time); verify = one target step over k + 1 "
                  "positions (one read of the weights, k + 1 times the FLOPs); the self:N draft "
                  "reads N/L of the layers plus the LM head, an EAGLE-3 head one bf16 layer "
                  "plus its LM head (eagle3:K: FR-Spec's K tokens), lookup nothing.",
                  markup=False)


def command(
    model: Annotated[str, typer.Argument(help="A known config name (minicpm4.1-8b), a "
                                         "config.json, a model folder, or 'demo'.")],
    target: TargetOpt,
    quant: QuantOpt,
    backend: BackendOpt = None,
    context: Annotated[list[int] | None, typer.Option("--context", "-c", help="Context length "
                       "(repeat; default 4096, 32768, 131072).")] = None,
    json_out: JsonOpt = False,
    speculative: Annotated[bool, typer.Option(
        "--speculative", help="Also predict the speed-up of speculative decoding with the "
        "lookup, self:N and EAGLE-3 drafts.")] = False,
    acceptance: Annotated[float | None, typer.Option(
        "--acceptance", min=0.0, max=1.0, help="Per-token draft acceptance probability for "
        f"--speculative (default {DEFAULT_ACCEPTANCE}, assumed; `arkinfer bench --speculative` "
        "measures it).")] = None,
    draft_k: Annotated[int, typer.Option("--draft-k", min=1, max=16,
                                         help="Draft tokens per verify step.")] = DEFAULT_K,
    draft_layers: Annotated[int | None, typer.Option(
        "--draft-layers", min=1, help="N of the self:N draft (default: a quarter of the "
        "model's layers).")] = None,
    draft_vocab: Annotated[int | None, typer.Option(
        "--draft-vocab", min=1, help="Add a row for an EAGLE-3 head with FR-Spec's K most "
        "frequent tokens (e.g. 32768 of MiniCPM4.1's 73,448).")] = None,
    samples: Annotated[int, typer.Option("--samples", min=1, help="Calibration sequences the "
                                         "build would use (build's default).")] = 128,
    seq_len: Annotated[int, typer.Option("--seq-len", min=1, help="Tokens per calibration "
                                         "sequence (build's default).")] = 512,
    gpu: Annotated[str | None, typer.Option(
        "--gpu", help="Also predict the GPTQ calibration on this GPU (`build --device cuda`): "
        "h200, h100, h100-pcie, a100, l40s, l4, rtx-4090, jetson-orin.")] = None,
) -> None:
    """Memory fit and predicted latency of MODEL on TARGET with QUANT."""
    spec = (acceptance, draft_k, draft_layers, draft_vocab) if speculative else None
    run(model, target, quant, backend, context, json_out, spec, (samples, seq_len), gpu)


@handle_errors
def run(model: str, target: str, quant: str, backend: str | None, context: list[int] | None,
        json_out: bool,
        speculative: tuple[float | None, int, int | None, int | None] | None = None,
        calib: tuple[int, int] = (128, 512), gpu: str | None = None) -> None:
    """`speculative`: (acceptance or None for the assumed default, k, self:N layers or None,
    FR-Spec's draft vocabulary or None); `calib`: (samples, seq_len) of the build's
    calibration, for its predicted cost; `gpu`: also predict that calibration on this GPU."""
    from arkinfer.pipeline.build_cost import predict_build

    plan = make_plan(model, target, quant, backend, tuple(context or CONTEXTS))
    build = predict_build(plan.source.raw_config, plan.cost.recipe or plan.quant, *calib,
                          gpu=gpu)
    refusal = plan.refusal()
    spec_rows: list[SpeculativePrediction] = []
    if speculative is not None:
        acceptance, k, layers, draft_vocab = speculative
        spec_rows = speculative_rows(plan, DEFAULT_ACCEPTANCE if acceptance is None
                                     else acceptance, k, layers, draft_vocab)
    if json_out:
        out = plan.as_dict()
        if speculative is not None:
            out["speculative"] = {"ctx": min(plan.contexts),
                                  "acceptance_assumed": speculative[0] is None,
                                  "predictions": [r.as_dict() for r in spec_rows]}
        out["build"] = {"samples": calib[0], "seq_len": calib[1], **build}
        print_json(out)
    else:
        _print_header(plan)
        _print_rows(plan)
        if spec_rows:
            _print_speculative(spec_rows, min(plan.contexts), speculative[0] is None)
        _print_build(build, *calib)
        print_table(f"ops on {plan.backend}", ["op", "implementation"],
                    [list(r) for r in plan.ops()])
        for note in plan.notes:
            console.print(terminal_safe(f"note: {note}"), markup=False)
    if refusal is not None:
        report(refusal)
        raise typer.Exit(code=1)
