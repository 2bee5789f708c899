"""`arkinfer inspect` — what a checkpoint is and what it costs in memory."""

from __future__ import annotations

from typing import Annotated

import typer

from arkinfer.cli._errors import handle_errors
from arkinfer.cli._options import JsonOpt
from arkinfer.cli._output import console, print_json, print_kv, print_table, terminal_safe

HELP = ("Describe a model: architecture, parameters, dimensions, sparse config, and weight and "
        "KV-cache memory at 4K/32K/128K context. Reads only config.json and tensor headers. "
        "With --ir, print the model's graph IR instead (traced shape-only from config.json).")
EXAMPLES = [
    "arkinfer inspect demo",
    "arkinfer inspect ./MiniCPM4.1-8B --json",
    "arkinfer inspect ./MiniCPM4.1-8B --ir",
    "arkinfer inspect demo --ir --ir-passes default",
]


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


def _count(n: int) -> str:
    return f"{n:,} ({n / 1e9:.3f} B)" if n >= 1e8 else f"{n:,} ({n / 1e6:.2f} M)"


def _sparse(sc: dict | None) -> str:
    if not sc:
        return "none (dense attention)"
    return (f"InfLLM v2: kernel {sc.get('kernel_size')}/{sc.get('kernel_stride')}, block "
            f"{sc.get('block_size')}, init {sc.get('init_blocks')}, window {sc.get('window_size')}, "
            f"topk {sc.get('topk')}, dense below {sc.get('dense_len')} tokens, use_nope "
            f"{sc.get('use_nope')}")


def _print_ir(model: str, passes: str, json_out: bool) -> None:
    """The IR of `model` (shape-only: config.json is enough), after `passes`."""
    from arkinfer import ir

    program = ir.trace(model, shape_only=True)
    names = {"none": [], "default": list(ir.DEFAULT_PIPELINE)}.get(
        passes, [p.strip() for p in passes.split(",") if p.strip()])
    program = ir.run_passes(program, names)
    if json_out:
        print_json(ir.program_to_json(program))
    else:
        console.print(terminal_safe(ir.print_ir(program), keep="\n"), markup=False, highlight=False,
                      end="")


@handle_errors
def command(
    model: Annotated[str, typer.Argument(help="Model folder or 'demo'.")] = "demo",
    json_out: JsonOpt = False,
    show_ir: Annotated[bool, typer.Option(
        "--ir", help="Print the graph IR (prefill and decode) instead of the summary; needs only "
        "config.json.")] = False,
    ir_passes: Annotated[str, typer.Option(
        "--ir-passes", help="With --ir: passes to run first: none, default, or a comma list of "
        "fuse_qkv, fuse_gate_up, fold_rope_tables, dce.")] = "none",
) -> None:
    if show_ir:
        _print_ir(model, ir_passes, json_out)
        return
    from arkinfer.frontend.checkpoint import open_checkpoint
    from arkinfer.frontend.summary import summarize

    info = summarize(open_checkpoint(model))
    if json_out:
        print_json(info)
        return
    d = info["dims"]
    print_kv(f"{info['model_type']} — {info['path']}", [
        ("architecture", ", ".join(info["architectures"]) or info["model_type"]),
        ("parameters", _count(info["parameters"])),
        ("layers / hidden / ffn", f"{d['layers']} / {d['hidden_size']} / {d['intermediate_size']}"),
        ("heads (q / kv) x dim", f"{d['attention_heads']} / {d['kv_heads']} x {d['head_dim']}"),
        ("vocab", d["vocab_size"]),
        ("rope", info["rope"]),
        ("scales (emb / residual / logit÷)", " / ".join(f"{v:g}" for v in info["scales"].values())),
        ("sparse attention", _sparse(info["sparse_config"])),
        ("weights", (f"{_gib(info['weights']['bytes'])} in {info['weights']['files']} file(s), "
                    f"{', '.join(info['weights']['dtypes'])}; bf16 {_gib(info['weights']['bf16_bytes'])},"
                    f" int4 g128 ≈ {_gib(info['weights']['int4_g128_bytes'])}")),
        ("KV cache (bf16)", f"{info['kv_cache_bytes_per_token_bf16'] / 1024:.1f} KiB/token"),
    ])
    rows = [[f"{int(c) // 1024}K", _gib(v["dense_bf16_bytes"]),
             _gib(v["infllmv2_extra_bytes"]) if info["sparse_config"] else "-"]
            for c, v in info["kv_cache"].items()]
    print_table("KV cache by context", ["context", "K+V (bf16)", "InfLLM v2 compressed keys"], rows)
    if info["tokenizer"] is None:
        console.print("[yellow]no tokenizer.json: run and eval need one[/]", markup=True)
