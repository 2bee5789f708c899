"""`arkinfer bench` — llama-bench-style prompt-processing and generation speed of an artifact."""

from __future__ import annotations

import csv
import io
import json
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from arkinfer.cli._errors import handle_errors
from arkinfer.cli._options import JsonOpt, deprecated_alias
from arkinfer.cli._output import console, err_console, terminal_safe

HELP = ("Measure an artifact on this machine the way llama-bench does: prompt processing (pp, "
        "tokens/s over -p tokens) and generation (tg, tokens/s over -n single-token steps) after "
        "-d tokens of context, -r repetitions after a warm-up, mean ± std, TTFT and peak RSS. "
        "Beside each measured rate: the latency model's prediction for this host and "
        "measured/predicted. Output as a markdown table, JSON or CSV with llama-bench's field "
        "names (n_prompt, n_gen, n_depth, avg_ts, stddev_ts, samples_ts, ...) plus ArkInfer's "
        "(test, attention, ttft_ms, peak_rss_bytes, predicted_ts, measured_over_predicted, "
        "huge_page_malloc). --speculative adds a spec-tg<n> row per -n: greedy decoding of a "
        "repetitive task (editing a given text) plainly and with a draft (--draft, prompt lookup "
        "by default), interleaved: tokens/s of both, the speed-up, mean accepted length per "
        "verify step, acceptance rate, seconds in draft and in verify; the two must give the same "
        "tokens (an error names the first differing position).")
EXAMPLES = [
    "arkinfer bench dist/demo.host.q4_0",
    "arkinfer bench dist/demo.host.q4_0 -p 128,512 -n 64 -d 0,1024,2048 -r 3 --plot bench.png",
    "arkinfer bench dist/demo.host.q4_0 --attention both -d 0,4096 --json > bench.json",
    "arkinfer bench dist/smollm2.rpi5.q4_0 --format csv --threads 2",
    "arkinfer bench dist/demo.android-sd8gen3.q4_0 --rpc 192.168.1.7:9090 -p 64 -n 32",
    "arkinfer bench dist/demo.android-sd8gen3.q4_0 --rpc tracker.lan:9190 --key android",
    "arkinfer bench dist/smollm2.host.q4_0 -p 0 -n 128 --speculative",
    "arkinfer bench dist/smollm2-360m.host.q4_0 --speculative --draft dist/smollm2.host.q4_0",
    "arkinfer bench dist/demo.host.q4_0 -p 0 -n 64 --speculative --draft-k 6 --json",
]


DRAFT_K = 4  # --draft-k's default, as `arkinfer run`'s


class OutFormat(StrEnum):
    md = "md"
    json = "json"
    csv = "csv"


class Attention(StrEnum):
    default = "default"
    dense = "dense"
    sparse = "sparse"
    both = "both"


def _ints(text: str, flag: str) -> tuple[int, ...]:
    from arkinfer.errors import ArkError

    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values:  # the range of each value is BenchSpec's check
        raise ArkError(f"{flag} {text!r} is not a comma-separated list of non-negative integers",
                       hint=f"e.g. {flag} 128,512")
    return values


@handle_errors
def command(
    artifact: Annotated[Path, typer.Argument(help="Artifact folder written by `arkinfer build`.")],
    prompts: Annotated[str, typer.Option("-p", "--n-prompt", help="Prompt lengths (comma list; "
                                         "0 = no pp test).")] = "512",
    gens: Annotated[str, typer.Option("-n", "--n-gen", help="Generated tokens (comma list; 0 = "
                                      "no tg test).")] = "128",
    depths: Annotated[str, typer.Option("-d", "--n-depth", help="Context depths (comma list).")
                      ] = "0",
    repetitions: Annotated[int, typer.Option("-r", "--repetitions", help="Measured runs per "
                                             "test.")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", help="Unmeasured runs before each test.")
                      ] = 1,
    attention: Annotated[Attention, typer.Option(
        "--attention", help="Sparse-config models: dense, sparse (InfLLM v2), both, or default "
        "(what the artifact runs).")] = Attention.default,
    output: Annotated[OutFormat, typer.Option("--format", "-f", help="md, json or csv "
                                              "(llama-bench's -o).")] = OutFormat.md,
    json_out: JsonOpt = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write tokens/s against depth to "
                                              "this .png (or .svg, .pdf) file, exactly there.")
                    ] = None,
    threads: Annotated[int | None, typer.Option("--threads", help="CPU threads, 1 to this "
                                                "machine's CPU count (default: torch's).")
                       ] = None,
    rpc: Annotated[str | None, typer.Option("--rpc", help="HOST:PORT of a TVM RPC server (or "
                                            "tracker with --key): time the artifact on that "
                                            "remote device (tvm artifacts).")] = None,
    key: Annotated[str | None, typer.Option("--key", help="With --rpc: the tracker's device "
                                            "key, e.g. android.")] = None,
    rpc_timeout: Annotated[float | None, typer.Option(
        "--rpc-timeout", help="With --rpc: seconds each remote step (connect, upload, each timed "
        "call) may take before bench gives up (default 60).")] = None,
    speculative: Annotated[bool, typer.Option(
        "--speculative", help="Add rows for greedy speculative decoding against plain decoding "
        "of the same artifact (runtimes that speculate: gguf, mlx, reference, dense onnx).")
    ] = False,
    draft: Annotated[str | None, typer.Option(
        "--draft", help="With --speculative: the draft, in any form `arkinfer run --draft` "
        "takes: 'lookup', 'self:N', an EAGLE-3 head's folder or a draft model's artifact with "
        "the same tokenizer. Default: the draft the artifact carries (build --draft), else "
        "lookup.")] = None,
    draft_k: Annotated[int | None, typer.Option(
        "--draft-k", min=1, max=16, help="With --speculative: draft tokens per verify step "
        "(default 4).")] = None,
    old_output: Annotated[OutFormat | None, typer.Option("-o", "--output", hidden=True)] = None,
    old_threads: Annotated[int | None, typer.Option("-t", hidden=True)] = None,
) -> None:
    from arkinfer.errors import ArkError
    from arkinfer.pipeline.bench import BenchSpec, speculative_gens
    from arkinfer.plot_file import check_plot_path

    if old_output is not None:  # -o is the output folder in every other command
        deprecated_alias("`bench -o FORMAT`", "--format FORMAT (-f)")
        output = old_output
    if old_threads is not None:  # -t is --target in every other command
        deprecated_alias("`bench -t N`", "--threads N")
        threads = old_threads
    if json_out:
        output = OutFormat.json
    # every number and the plot path are checked here, before anything is loaded or allocated
    modes = ("dense", "sparse") if attention == Attention.both else (attention.value,)
    spec = BenchSpec(_ints(prompts, "-p"), _ints(gens, "-n"), _ints(depths, "-d"), repetitions,
                     warmup, modes, *(() if rpc_timeout is None else (rpc_timeout,)))
    cpus = os.cpu_count() or 1
    if threads is not None and not 1 <= threads <= cpus:
        raise ArkError(f"--threads {threads} is outside the allowed range 1..{cpus} (at least "
                       f"1, at most the {cpus} CPUs of this machine)",
                       hint=f"pass --threads between 1 and {cpus}, or leave it out to use "
                       "torch's default")
    if plot is not None:
        check_plot_path(plot)
    if not speculative and (draft is not None or draft_k is not None):
        raise ArkError("--draft and --draft-k choose the draft of --speculative's rows",
                       hint="add --speculative, e.g. --speculative --draft lookup --draft-k 4")
    if speculative and rpc is not None:
        raise ArkError("--speculative times decoding on this machine; --rpc times a remote device",
                       hint="drop --speculative, or bench without --rpc")
    if speculative:
        speculative_gens(spec)
    from arkinfer.backend import runner_context
    from arkinfer.frontend.checkpoint import (
        read_config,  # (these import torch: after the checks)
    )
    from arkinfer.pipeline.artifact import load_runner
    from arkinfer.pipeline.bench import (
        host_predictor,
        run_bench,
        run_speculative_bench,
        speculative_prompt,
        write_plot,
    )
    from arkinfer.pipeline.draft import parse_draft
    from arkinfer.pipeline.draft_artifact import artifact_draft

    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    if rpc is not None or key is not None:
        manifest, rows = _remote_rows(artifact, rpc, key, spec, attention)
    else:
        with err_console.status(Text("loading")) as status:
            manifest, runner = load_runner(
                artifact, bench=True,
                step=lambda m: status.update(Text(terminal_safe(f"loading: {m}"))))
            if attention != Attention.default and not manifest["source"].get("sparse_config"):
                raise ArkError(f"--attention {attention.value}: {manifest['name']} has no "
                               "sparse_config, so it only runs dense attention",
                               hint="drop --attention (or use a sparse-config model like "
                               "the demo)")
            source = Path(manifest["source"]["path"])
            raw = read_config(source) if (source / "config.json").is_file() else None
            context = runner_context(runner, raw)

            def progress(message: str) -> None:
                status.update(Text(terminal_safe(f"bench: {message}")))

            if speculative:  # every refusal before anything is timed
                prompt = speculative_prompt(runner, manifest, spec, context)
                drafter = (parse_draft(draft, runner) if draft else
                           artifact_draft(artifact, manifest, runner)
                           or parse_draft("lookup", runner))
            predictor = host_predictor(manifest, raw) if raw else None
            rows = run_bench(runner, manifest, spec, predictor=predictor, progress=progress,
                             context=context)
            if speculative:
                rows += run_speculative_bench(runner, manifest, spec, drafter,
                                              draft_k or DRAFT_K, prompt, progress=progress)
    if plot is not None:
        written = write_plot(rows, plot, f"{manifest['name']} on {rows[0]['cpu_info']}")
        err_console.print(terminal_safe(f"plot written to {written}"))
    if output == OutFormat.json:
        print(json.dumps(rows, indent=2))
    elif output == OutFormat.csv:
        print(_csv(rows), end="")
    else:
        _markdown(rows, manifest)


def _remote_rows(artifact: Path, rpc: str | None, key: str | None, spec,
                 attention: Attention) -> tuple[dict, list[dict]]:
    """(manifest, rows) timed on a TVM RPC remote (backends/tvm/rpc_bench.py)."""
    from arkinfer.backend import get_backend
    from arkinfer.errors import ArkError
    from arkinfer.pipeline import manifest as mf
    from arkinfer.pipeline.artifact import check_integrity

    if rpc is None:
        raise ArkError(f"--key {key} needs --rpc HOST:PORT (the tracker's address)",
                       hint="e.g. --rpc 192.168.1.2:9190 --key android")
    manifest = mf.read_manifest(artifact)
    check_integrity(artifact, manifest)
    if attention != Attention.default:
        raise ArkError(f"--rpc runs the artifact's default attention; --attention is "
                       f"{attention.value}", hint="drop --attention, or bench without --rpc")
    backend = get_backend(manifest["backend"]["name"])
    with err_console.status(Text(terminal_safe(f"connecting to {rpc}"))) as status:
        rows = backend.bench_remote(
            artifact, manifest, rpc, key, spec,
            progress=lambda m: status.update(Text(terminal_safe(f"bench: {m}"))))
    return manifest, rows


def _csv(rows: list[dict]) -> str:
    """CSV with llama-bench's fields; text fields (manifest name, cpu_info) `terminal_safe`.
    The columns are every row's fields, in order of appearance (`spec-tg` rows add theirs, left
    empty in the other rows)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
    writer.writeheader()
    for r in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, list) else
                         terminal_safe(v) if isinstance(v, str) else v for k, v in r.items()})
    return buf.getvalue()


def markdown_table(rows: list[dict]) -> str:
    """llama-bench's markdown layout plus ArkInfer's columns (a pipe table to paste anywhere)."""
    def f(v, spec=".2f"):
        return "-" if v is None else format(v, spec)

    head = ["model", "size", "backend", "threads", "attention", "test", "t/s", "TTFT ms",
            "predicted t/s", "measured/predicted", "peak RSS MiB"]
    cells = []
    for r in rows:
        test = r["test"] + (f" @ d{r['n_depth']}" if r["n_depth"] else "")
        cells.append([r["model_filename"], f"{r['model_size'] / 2**20:.2f} MiB", r["backends"],
                      str(r["n_threads"] or "-"), r["attention"], test,
                      f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}", f(r["ttft_ms"], ".1f"),
                      f(r["predicted_ts"]), f(r["measured_over_predicted"]),
                      f(r["peak_rss_bytes"] and r["peak_rss_bytes"] / 2**20, ".0f")])
    return _pipe_table(head, cells)


def _pipe_table(head: list[str], rows: list[list[str]]) -> str:
    """A markdown pipe table. Cells hold manifest text (the model's name, a draft folder's):
    shown terminal_safe, and a `|` cannot add a column."""
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for cells in rows:
        lines.append("| " + " | ".join(terminal_safe(c).replace("|", "\\|") for c in cells)
                     + " |")
    return "\n".join(lines) + "\n"


def speculative_table(rows: list[dict]) -> str:
    """The `spec-tg<n>` rows' own columns (pipeline/bench.py's SPEC_FIELDS) as a pipe table."""
    head = ["attention", "test", "draft", "k", "plain t/s", "speculative t/s", "speed-up",
            "accepted length", "acceptance", "draft s", "verify s", "greedy identical"]
    return _pipe_table(head, [
        [r["attention"], f"{r['test']} @ d{r['n_depth']}", r["draft"], str(r["draft_k"]),
         f"{r['plain_ts']:.2f}", f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}",
         f"{r['speedup']:.2f}x", f"{r['mean_accepted_length']:.2f}",
         f"{r['acceptance_rate']:.1%}", f"{r['draft_s']:.4f}", f"{r['verify_s']:.4f}",
         "yes" if r["greedy_identical"] else "NO"] for r in rows])


def _markdown(rows: list[dict], manifest: dict) -> None:
    speculative = [r for r in rows if "draft" in r]
    print(markdown_table([r for r in rows if "draft" not in r]), end="")
    if speculative:
        print("\n" + speculative_table(speculative), end="")
    if "TVM RPC" in rows[0]["backends"]:
        console.print(f"\ndevice: {terminal_safe(rows[0]['cpu_info'])}. Timed there by TVM's "
                      "time_evaluator (tg: one decode step at depth + n/2); no prediction, no RSS.")
        return
    console.print(f"\nCPU: {terminal_safe(rows[0]['cpu_info'])}. predicted: arkinfer.latency for "
                  "this host (`arkinfer doctor` measures its bandwidth and compute).")
    if speculative:
        console.print("spec-tg<n>: n greedy tokens after the prompt's prefill (d = its tokens), "
                      "plainly and with the draft; accepted length: tokens per verify step.")
