"""`arkinfer quantize` — calibrate a float checkpoint and write a quantised HF folder."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from arkinfer.cli._errors import handle_errors
from arkinfer.cli._options import CalibOpt, ForceOpt, JsonOpt, ModelArg, seed_in_range
from arkinfer.cli._output import (
    console,
    err_console,
    print_json,
    print_kv,
    print_table,
    progress_bar,
    terminal_safe,
)

HELP = ("Quantise a float checkpoint (RTN, GPTQ, P-GPTQ, AWQ or ternary) into a runtime layout "
        "(gptq, marlin, awq, or any registered format). Calibration streams one decoder block at "
        "a time from the memory-mapped checkpoint, so peak memory is one block plus the "
        "calibration activations; per-block results are kept in a work folder and --resume "
        "continues an interrupted run with an identical result. Default calibration text: "
        "arkinfer/data/corpus_train.txt. A layer the format cannot take stays in float and is "
        "listed in the summary (--strict makes that an error).")
EXAMPLES = [
    "arkinfer quantize ./smollm2-hf --method gptq --bits 4 --group-size 64 -o ./smollm2-gptq",
    "arkinfer quantize ./MiniCPM4.1-8B --preset marlin -o ./minicpm-marlin --resume",
    ("arkinfer quantize ./smollm2-hf --method awq --group-size 64 --format awq --calib my.jsonl "
     "--samples 64 --seq-len 512 -o ./smollm2-awq --json"),
    "arkinfer quantize ./model --method pgptq --act-order --format gptq -o ./model-pgptq --strict",
    ("arkinfer quantize ./smollm2-hf --preset gptq-q4_0 --act-order --static-groups "
     "-o ./smollm2-q4_0"),
]


class Method(str, Enum):
    rtn = "rtn"
    gptq = "gptq"
    pgptq = "pgptq"
    awq = "awq"
    ternary = "ternary"


class Grid(str, Enum):
    mse = "mse"
    ggml = "ggml"
    minmax = "minmax"


_DEFAULT_FORMAT = {"awq": "awq", "ternary": "gguf-tq2_0"}


def build_recipe(method: str | None, bits: int | None, group_size: int | None,
                 sym: bool | None, act_order: bool, fmt: str | None, preset: str | None,
                 quantize_lm_head: bool, grid: str | None = None):
    """A QuantRecipe from a preset and/or explicit options (explicit options win)."""
    from dataclasses import replace

    from arkinfer.quant import QuantRecipe, get_preset

    if preset is not None:
        base = get_preset(preset)
        method = method or base.calib
        fields = {"calib": method, "format": fmt or base.format,
                  "bits": bits if bits is not None else base.bits,
                  "group_size": group_size if group_size is not None else base.group_size,
                  "sym": sym if sym is not None else base.sym,
                  "desc_act": act_order or base.desc_act}
        recipe = replace(base, **fields)
    else:
        method = method or "gptq"
        ternary = method == "ternary"
        recipe = QuantRecipe(
            calib=method, format=fmt or _DEFAULT_FORMAT.get(method, "gptq"),
            bits=bits if bits is not None else (2 if ternary else 4),
            group_size=group_size if group_size is not None else (-1 if ternary else 128),
            sym=sym if sym is not None else method != "awq", desc_act=act_order)
    if quantize_lm_head:
        recipe = replace(recipe, skip=tuple(p for p in recipe.skip if p != "lm_head"))
    if grid is not None:
        recipe = replace(recipe, grid=grid)
    return recipe


@handle_errors
def command(
    model: ModelArg,
    out: Annotated[Path, typer.Option("-o", "--out", help="Folder to write.",
                                      show_default=False)] = ...,
    method: Annotated[Method | None, typer.Option("--method", help="Calibration algorithm "
                                                  "(default gptq, or the preset's).")] = None,
    bits: Annotated[int | None, typer.Option("--bits", help="2, 3, 4 or 8.")] = None,
    group_size: Annotated[int | None, typer.Option(
        "--group-size", help="Input columns per scale; -1 = whole row.")] = None,
    sym: Annotated[bool | None, typer.Option("--sym/--asym", help="Symmetric or asymmetric "
                                             "codes (default: asym for awq).")] = None,
    act_order: Annotated[bool, typer.Option("--act-order", help="GPTQ act-order (desc_act).")] = False,
    grid: Annotated[Grid | None, typer.Option(
        "--grid", help="How a group's scale is chosen: mse (searched per group, weighted by "
        "the inputs' mean square under GPTQ; the default), ggml (Q4_0's rule: all 16 levels) or "
        "minmax (the GPTQ reference: 15 of 16 levels when symmetric).")] = None,
    static_groups: Annotated[bool, typer.Option(
        "--static-groups", help="GPTQ: group scales fixed before the columns are processed; with "
        "--act-order no g_idx is needed, so formats without one (gguf-q4_0, awq, mlx) take "
        "act-order.")] = False,
    fmt: Annotated[str | None, typer.Option("--format", help="Storage format: gptq, marlin, awq, "
                                            "gguf-q4_0, gguf-tq2_0, mlx, ort, ...")] = None,
    preset: Annotated[str | None, typer.Option("--preset", help="Named recipe: marlin, gptq, "
                                               "awq, q4_0, ternary, ...")] = None,
    calib: CalibOpt = None,
    samples: Annotated[int, typer.Option("--samples", help="Calibration sequences.")] = 128,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per sequence.")] = 512,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the window sampling, 0..2^64-1.",
                                      callback=seed_in_range)] = 0,
    damp: Annotated[float | None, typer.Option("--damp", help="GPTQ damping fraction.")] = None,
    quantize_lm_head: Annotated[bool, typer.Option("--quantize-lm-head",
                                                   help="Quantise lm_head too.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted run.")] = False,
    report: Annotated[bool, typer.Option(
        "--report", help="RTN / ternary: calibrate anyway to measure each layer's SNR (costs a "
        "forward over --samples x --seq-len tokens). Without it they need no calibration.")
    ] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Fail when the format cannot take a "
                                         "layer.")] = False,
    work_dir: Annotated[Path | None, typer.Option("--work-dir", help="Per-block results "
                                                  "(default OUT.work).")] = None,
    force: ForceOpt = False,
    json_out: JsonOpt = False,
) -> None:
    from arkinfer.errors import ArkError
    from arkinfer.frontend.checkpoint import open_checkpoint
    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.calib.weight_only import is_weight_only, quantize_weight_only
    from arkinfer.quant.calib_data import check_calibration_size, load_calibration
    from arkinfer.quant.export import check_quantised_output, export_folder
    from arkinfer.resolve import fit_recipe

    # act-order over static groups leaves g_idx static: the recipe (format check) has no desc_act
    recipe = build_recipe(method.value if method else None, bits, group_size, sym,
                          act_order and not static_groups, fmt, preset, quantize_lm_head,
                          grid.value if grid else None)
    ckpt = open_checkpoint(model)
    check_quantised_output(out, ckpt.path, force=force)  # before hours of calibration
    if group_size is None:  # the preset's group, fitted to the model as `build` fits it
        recipe, notes = fit_recipe(recipe, ckpt.raw_config)
        for note in notes:
            err_console.print(terminal_safe(f"note: {note}"), markup=False)
    options: dict = {"damp": damp} if damp is not None else {}
    if static_groups:
        options.update(static_groups=True, act_order=act_order)
    work = work_dir or out.with_name(out.name + ".work")
    # the settings are checked even when a weight-only recipe does not use them: a bad value is
    # an error, never silently ignored
    check_calibration_size(samples, seq_len, ckpt.config.max_position_embeddings,
                           ckpt.config.hidden_size)
    if is_weight_only(recipe) and not report:  # RTN / ternary: from the weights alone
        what = f"quantising {ckpt.path.name}: {recipe.describe()}, no calibration"

        def run_it(progress=None):
            return quantize_weight_only(ckpt, recipe, work, options=options, strict=strict,
                                        progress=progress)
    else:
        if ckpt.tokenizer is None:
            raise ArkError(f"{ckpt.path} has no tokenizer.json; calibration text must be "
                           "tokenised", hint="add the model's tokenizer.json to the folder")
        eos = ckpt.config.eos_token_id
        eos = eos[0] if isinstance(eos, list) and eos else eos
        data = load_calibration(ckpt.tokenizer, calib, samples, seq_len, seed,
                                eos if isinstance(eos, int) else None,
                                max_positions=ckpt.config.max_position_embeddings,
                                hidden_size=ckpt.config.hidden_size)
        what = (f"quantising {ckpt.path.name}: {recipe.describe()}, calibration "
                f"{data.samples} x {data.seq_len} tokens ({data.settings['source']})")

        def run_it(progress=None):
            return calibrate(ckpt, recipe, data, work, options=options, resume=resume,
                             strict=strict, progress=progress)
    try:
        if json_out:
            run = run_it()
        else:
            err_console.print(terminal_safe(what), markup=False)
            with _progress_bar() as bar:
                task = bar.add_task("quantise", total=ckpt.config.num_hidden_layers, info="")

                def progress(layer: int, n_layers: int, seconds: float) -> None:
                    bar.update(task, completed=layer + 1, total=n_layers,
                               info=f"block {layer} took {seconds:.1f} s")

                run = run_it(progress)
        folder = export_folder(run, out, force=force)
    except BaseException:
        _after_failure(work, resumable=not (is_weight_only(recipe) and not report))
        raise
    summary = json.loads((folder / "quant_summary.json").read_text())
    if json_out:
        print_json({"path": str(folder), **summary})
        return
    _print_summary(folder, summary)


def _after_failure(work: Path, *, resumable: bool) -> None:
    """A failed run (disk full, Ctrl-C, ...) leaves no work folder that means nothing: a
    calibration's finished blocks are kept for --resume and the user is told where; RTN and
    ternary work (no --resume) is removed. Only a folder holding ArkInfer's marker is touched."""
    from arkinfer.output_folder import remove_work_folder

    if not resumable:
        remove_work_folder(work)
    elif any(work.glob("block_*.safetensors")):
        err_console.print(terminal_safe(f"note: the finished blocks are kept in {work}; rerun the "
                                        "same command with --resume to continue from them, or "
                                        "delete that folder"), markup=False)
    else:
        remove_work_folder(work)


def _progress_bar():
    return progress_bar("calibrating", "info")


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _print_summary(folder: Path, s: dict) -> None:
    rows = []
    for b in s["blocks"]:
        lin = [r for r in b["linears"] if r["status"] == "quantised" and r["snr_db"] is not None]
        worst = min(lin, key=lambda r: r["snr_db"]) if lin else None
        floats = [r["name"].rsplit(".", 1)[-1] for r in b["linears"] if r["status"] != "quantised"]
        rows.append([b["block"], f"{b['seconds']:.1f}", _fmt(b["block_snr_db"]),
                     (f"{_fmt(worst['snr_db'])} ({worst['name'].rsplit('.', 1)[-1]})"
                      if worst else "-"),
                     ", ".join(floats) or "-"])
    print_table("quality per block (SNR in dB on the calibration inputs)",
                ["block", "seconds", "block SNR", "worst linear SNR", "kept in float"], rows)
    floats = [r for b in s["blocks"] for r in b["linears"] if r["status"] != "quantised"]
    if floats:
        print_table("layers not quantised", ["layer", "why"],
                    [[r["name"], r.get("reason", r["status"])] for r in floats])
    calib = s["calibration"]
    calib_text = (f"{calib['samples']} x {calib['seq_len']} tokens from {calib['source']}, "
                  f"sha256 {calib['sha256'][:16]}" if calib.get("sha256") else
                  "none: a weight-only recipe (RTN / ternary) needs no activations; "
                  "--report measures SNR on a calibration sample")
    snr_text = f"{_fmt(s['mean_linear_snr_db'])} / {_fmt(s['mean_block_snr_db'])} dB"
    times = (f"{s['timings']['calibration_seconds']:.1f} s calibration, "
             f"{s['timings']['export_seconds']:.1f} s export")
    print_kv(f"quantised {Path(s['source']).name}", [
        ("recipe", s["recipe"]),
        ("calibration", calib_text),
        ("linears", f"{s['quantised_linears']} quantised, {len(s['float_linears'])} kept in float"),
        ("bits per weight", s["bits_per_weight"]),
        ("mean linear / block SNR", snr_text),
        ("lm_head", "quantised" if s["lm_head"] and s["lm_head"].get("status") == "quantised"
         else "float"),
        ("time", times),
        ("output", str(folder)),
    ])
    console.print(terminal_safe(f"next: arkinfer eval {folder} --text "
                                "arkinfer/data/corpus_eval.txt"))
