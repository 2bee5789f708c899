"""`arkinfer quantize` — calibrate a float checkpoint and write a quantised HF folder."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from arkinfer.cli._errors import handle_errors
from arkinfer.cli._options import (
    CalibOpt,
    DeviceOpt,
    ForceOpt,
    JsonOpt,
    ModelArg,
    seed_in_range,
)
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
        "continues an interrupted run with an identical result. Default calibration text: the "
        "built-in multi-domain corpus (arkinfer/data/calib/). A layer the format cannot take stays in float and is "
        "listed in the summary (--strict makes that an error).")
EXAMPLES = [
    "arkinfer quantize ./smollm2-hf --method gptq --bits 4 --group-size 64 -o ./smollm2-gptq",
    "arkinfer quantize ./MiniCPM4.1-8B --preset marlin -o ./minicpm-marlin --resume",
    ("arkinfer quantize ./smollm2-hf --method awq --group-size 64 --format awq --calib my.jsonl "
     "--samples 64 --seq-len 512 -o ./smollm2-awq --json"),
    "arkinfer quantize ./model --method pgptq --act-order --format gptq -o ./model-pgptq --strict",
    ("arkinfer quantize ./smollm2-hf --preset gptq-q4_0 --act-order --static-groups "
     "-o ./smollm2-q4_0"),
    ("arkinfer quantize ./smollm2-hf --method gptq --samples 128 -o ./smollm2-gptq "
     "--save-imatrix smollm2.imatrix.gguf"),
    "arkinfer quantize ./smollm2-hf --preset q4_0 --imatrix smollm2.imatrix.gguf -o ./smollm2-q4",
    ("arkinfer quantize ./smollm2-hf --preset gptq-mix --act-order --static-groups "
     "-o ./smollm2-mix"),
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
                 quantize_lm_head: bool, grid: str | None = None, budget: float | None = None):
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
    if budget is not None:  # the output layer counts in the budget: quantised with the rest
        recipe = replace(recipe, budget=budget, skip=())
    return recipe


@handle_errors
def command(
    model: ModelArg,
    out: Annotated[Path, typer.Option("-o", "--out", help="Folder to write.",
                                      show_default=False)] = ...,
    method: Annotated[Method | None, typer.Option("--method", help="Calibration algorithm "
                                                  "(default gptq, or the preset's).")] = None,
    bits: Annotated[int | None, typer.Option("--bits", help="2, 3, 4, 5, 6 or 8 (as the format "
                                             "allows).")] = None,
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
                                            "gguf-q4_0, gguf-iq4_nl, gguf-q5_0, gguf-q4_k, "
                                            "gguf-q6_k, gguf-tq2_0, mlx, ort, ...")] = None,
    preset: Annotated[str | None, typer.Option("--preset", help="Named recipe: marlin, gptq, "
                                               "awq, q4_0, gptq-q4_0, gptq-iq4_nl, gptq-mix, "
                                               "ternary, ...")
                      ] = None,
    budget: Annotated[float | None, typer.Option(
        "--budget", help="Mixed precision: mean stored bits per weight over the linears and the "
        "output layer (4.0-8.5). Each tensor's sensitivity is measured on the calibration text "
        "(Fisher information of the model's own predictions) and the GGUF types Q4_0, IQ4_NL, "
        "Q4_K, Q5_0, Q5_K, Q6_K and Q8_0 are allotted to fit (docs/quant.md §12). The gptq-mix preset "
        "uses 4.9; e.g. --preset gptq-mix --budget 5.2 --act-order --static-groups.")] = None,
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
    save_imatrix: Annotated[Path | None, typer.Option(
        "--save-imatrix", help="Also write llama.cpp's importance matrix (per-column mean square "
        "of every linear's input, from one float forward over the calibration text) to this "
        "file: GGUF, or the legacy layout for a name ending in .dat. llama-quantize --imatrix "
        "and --imatrix here read it. An existing file needs --force. RTN / ternary still "
        "quantise from the weights alone. E.g. --save-imatrix smollm2.imatrix.gguf",
        show_default=False)] = None,
    imatrix: Annotated[Path | None, typer.Option(
        "--imatrix", help="RTN (--method rtn or an rtn preset, mse grid): weigh each group's "
        "scale search by this importance matrix (GGUF or .dat from llama-imatrix or "
        "--save-imatrix), as llama-quantize does. Linears it lacks are listed and quantised "
        "without importance. E.g. --preset q4_0 --imatrix imatrix.gguf",
        show_default=False)] = None,
    no_kl: Annotated[bool, typer.Option(
        "--no-kl", help="Skip measuring the quantised model against the float model (mean KL, "
        "top-1 agreement, perplexity change on the build gate's verify prompts, printed beside "
        "the SNR and written to quant_summary.json as `quality`). It loads the float model and "
        "the dequantised result one after the other in float32 and runs both over ~600 tokens: "
        "seconds for SmolLM2-135M, minutes and 32 GB of memory for an 8B model. E.g. "
        "arkinfer quantize ./MiniCPM4.1-8B --preset marlin -o ./minicpm-marlin --no-kl")] = False,
    refit: Annotated[bool | None, typer.Option(
        "--refit/--no-refit", help="Refit each row's scales to the final codes by least squares "
        "of the layer's output error on the calibration inputs (docs/quant.md §2, §4). Default: "
        "on for AWQ (its clipping shrinks the weights; the refit lowered the KL on every "
        "development and held-out text), off for GPTQ / P-GPTQ (0-2 % on development text, "
        "nothing held out).", show_default=False)] = None,
    asymmetric: Annotated[bool, typer.Option(
        "--asymmetric", help="GPTQ: aim each linear at the float model's outputs from the float "
        "model's own inputs, not at its float weights on the quantised model's inputs (GPTAQ; "
        "docs/quant.md §2). Carries the float model's hidden states beside the quantised one's: "
        "twice the calibration activations' memory and ~1.7x the calibration time. Not with "
        "P-GPTQ. E.g. --preset gptq-iq4_nl --asymmetric")] = False,
    static_passes: Annotated[int | None, typer.Option(
        "--static-passes", min=1, max=8,
        help="GPTQ with --static-groups: 2 or more re-chooses every group's scale from the "
        "weights as the previous pass's error feedback left them, then runs GPTQ again "
        "(docs/quant.md §2); each pass costs one more GPTQ solve per linear. Default: what "
        "build uses for the format (2 for gptq and marlin, 1 for the GGUF formats).")] = None,
    device: DeviceOpt = "auto",
    force: ForceOpt = False,
    json_out: JsonOpt = False,
) -> None:
    from arkinfer.disk_space import check_free_disk
    from arkinfer.errors import ArkError
    from arkinfer.frontend.checkpoint import open_checkpoint
    from arkinfer.pipeline.disk_space import build_disk_bytes
    from arkinfer.quant.calib.device import resolve_device
    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.calib.weight_only import is_weight_only, quantize_weight_only
    from arkinfer.quant.calib_data import calibration_of, check_calibration_size
    from arkinfer.quant.export import (
        SUMMARY_NAME,
        check_quantised_output,
        export_folder,
    )
    from arkinfer.quant.recipe import static_passes_for
    from arkinfer.resolve import fit_recipe

    # act-order over static groups leaves g_idx static: the recipe (format check) has no desc_act
    recipe = build_recipe(method.value if method else None, bits, group_size, sym,
                          act_order and not static_groups, fmt, preset, quantize_lm_head,
                          grid.value if grid else None, budget)
    ckpt = open_checkpoint(model)
    check_quantised_output(out, ckpt.path, force=force)  # before hours of calibration
    resolve_device(device)  # --device cuda without a GPU: refused before any work
    tokens = 0 if is_weight_only(recipe) and not report else samples * seq_len
    check_free_disk(out, build_disk_bytes(ckpt.raw_config, recipe, tokens),
                    "the quantised folder and its work files")
    if group_size is None:  # the preset's group, fitted to the model as `build` fits it
        recipe, notes = fit_recipe(recipe, ckpt.raw_config)
        for note in notes:
            err_console.print(terminal_safe(f"note: {note}"), markup=False)
    options: dict = {"damp": damp} if damp is not None else {}
    if static_groups:
        options.update(static_groups=True, act_order=act_order)
    if static_passes is not None and not static_groups:
        raise ArkError(f"--static-passes {static_passes} needs --static-groups (the passes "
                       "re-choose the static groups' scales)",
                       hint="add --static-groups, or drop --static-passes")
    if static_groups:  # default: build's choice for this storage format
        options["static_passes"] = static_passes or static_passes_for(recipe.format)
    if refit is not None:
        options["refit"] = refit
    if asymmetric:
        options["asymmetric"] = True
    if imatrix is not None:  # checked against the model before any work
        options["imatrix"] = _use_imatrix(imatrix, recipe, ckpt)
    if save_imatrix is not None:
        from arkinfer.quant.imatrix import check_imatrix_path

        check_imatrix_path(save_imatrix, force)
    work = work_dir or out.with_name(out.name + ".work")
    # the settings are checked even when a weight-only recipe does not use them: a bad value is
    # an error, never silently ignored
    check_calibration_size(samples, seq_len, ckpt.config.max_position_embeddings,
                           ckpt.config.hidden_size)
    # RTN / ternary need no calibration tokens; --save-imatrix needs them for its forward
    weight_only = is_weight_only(recipe) and not report
    data = None
    if not weight_only or save_imatrix is not None:
        data = calibration_of(ckpt, calib, samples, seq_len, seed,
                              progress=lambda s: err_console.print(terminal_safe(s),
                                                                   markup=False))
    if weight_only:  # RTN / ternary: from the weights alone
        what = f"quantising {ckpt.path.name}: {recipe.describe()}, no calibration"

        def run_it(progress=None):
            return quantize_weight_only(ckpt, recipe, work, options=options, strict=strict,
                                        progress=progress)
    else:
        what = (f"quantising {ckpt.path.name}: {recipe.describe()}, calibration "
                f"{data.samples} x {data.seq_len} tokens ({data.settings['source']})")

        def run_it(progress=None):
            return calibrate(ckpt, recipe, data, work, options=options, resume=resume,
                             strict=strict, progress=progress, device=device)
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
        _after_failure(work, resumable=not weight_only)
        raise
    saved = _save_imatrix(save_imatrix, ckpt, data, force, json_out) if save_imatrix else {}
    summary = json.loads((folder / SUMMARY_NAME).read_text())
    if not no_kl:
        summary = _measure_quality(ckpt.path, folder, quiet=json_out)
    if json_out:
        print_json({"path": str(folder), **summary, **saved})
        return
    _print_summary(folder, summary)
    if saved:
        console.print(terminal_safe(f"imatrix: {saved['imatrix']['path']} "
                                    f"({saved['imatrix']['linears']} linears, "
                                    f"{saved['imatrix']['tokens']} tokens)"), markup=False)


def _use_imatrix(path: Path, recipe, ckpt) -> str:
    """Check `--imatrix` against the recipe and the model's linears (lengths, MoE, a file made
    for another model: errors; linears it lacks: a note) -> the path for RTNConfig.imatrix."""
    from arkinfer.quant.calib.block import LINEARS
    from arkinfer.quant.imatrix import ImatrixError, read_imatrix

    if recipe.calib != "rtn":
        raise ImatrixError(f"--imatrix applies to RTN; the recipe calibrates with {recipe.calib}",
                           "use --method rtn or an rtn preset (q4_0, ...); GPTQ and AWQ weigh "
                           "their grids by their own activation statistics")
    if recipe.grid != "mse":
        raise ImatrixError(f"--imatrix needs the mse grid; the recipe uses {recipe.grid}",
                           "drop --grid or pass --grid mse")
    names = [f"model.layers.{i}.{n}" for i in range(ckpt.config.num_hidden_layers)
             for n in LINEARS] + ["lm_head"]
    linears = {n: ckpt.weights.shape(_weight_of(n, ckpt))[1] for n in names
               if not recipe.skips(n)}
    match = read_imatrix(path).match(linears)
    if match.missing:
        err_console.print(terminal_safe(f"note: {match.describe()}"), markup=False)
    return str(path.resolve())


def _weight_of(linear: str, ckpt) -> str:
    if linear == "lm_head" and ckpt.config.tie_word_embeddings:
        return "model.embed_tokens.weight"
    return linear + ".weight"


def _save_imatrix(path: Path, ckpt, data, force: bool, quiet: bool) -> dict:
    """Collect the float model's imatrix on the calibration data and write it to `path`."""
    from arkinfer.quant.calib.imatrix_collect import collect_imatrix
    from arkinfer.quant.imatrix import write_imatrix

    if quiet:
        im = collect_imatrix(ckpt, data)
    else:
        with progress_bar("imatrix", "info") as bar:
            task = bar.add_task("imatrix", total=ckpt.config.num_hidden_layers, info="")

            def progress(layer: int, n_layers: int, seconds: float) -> None:
                bar.update(task, completed=layer + 1, total=n_layers,
                           info=f"block {layer} took {seconds:.1f} s")

            im = collect_imatrix(ckpt, data, progress=progress)
    written = write_imatrix(path, im, force=force)
    tokens = int(max(float(e.counts.sum()) for e in im.entries.values()))
    return {"imatrix": {"path": str(written), "linears": len(im.entries), "tokens": tokens}}


def _measure_quality(source: Path, folder: Path, *, quiet: bool) -> dict:
    """KL etc. of `folder` against the float `source` on the verify prompts, recorded in its
    quant_summary.json (see `arkinfer.pipeline.verify.quantisation_quality`); the summary."""
    from arkinfer.pipeline.verify import quantisation_quality
    from arkinfer.quant.export import record_quality

    if quiet:
        return record_quality(folder, quantisation_quality(source, folder))
    from rich.text import Text

    with err_console.status(Text("")) as status:
        quality = quantisation_quality(source, folder, lambda message: status.update(
            Text(terminal_safe(f"KL vs the float model: {message}"))))
    return record_quality(folder, quality)


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
    from arkinfer.pipeline.verify import describe_quality

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
             f"{s['timings']['export_seconds']:.1f} s export"
             + (f", {s['quality']['seconds']:.1f} s KL" if s.get("quality") else ""))
    print_kv(f"quantised {Path(s['source']).name}", [
        ("recipe", s["recipe"]),
        ("calibration", calib_text),
        ("linears", f"{s['quantised_linears']} quantised, {len(s['float_linears'])} kept in float"),
        ("bits per weight", s["bits_per_weight"]),
        ("mean linear / block SNR", snr_text),
        ("mean KL vs float on the verify prompts", describe_quality(s.get("quality"))),
        ("lm_head", "quantised" if s["lm_head"] and s["lm_head"].get("status") == "quantised"
         else "float"),
        ("time", times),
        ("output", str(folder)),
    ])
    console.print(terminal_safe(f"next: arkinfer eval {folder} --text "
                                "arkinfer/data/corpus_eval.txt"))
