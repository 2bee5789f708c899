"""`arkinfer build` — a checkpoint to a verified artifact for one target."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.text import Text

from arkinfer.cli._errors import handle_errors
from arkinfer.cli._options import (
    BackendOpt,
    CalibOpt,
    DeviceOpt,
    ForceOpt,
    JsonOpt,
    QuantOpt,
    TargetOpt,
)
from arkinfer.cli._output import (
    console,
    err_console,
    print_json,
    print_kv,
    terminal_safe,
)

HELP = ("Build a verified artifact: load -> trace -> quantise -> lower -> verify -> write. The "
        "plan (model, target, backend, recipe, output) is checked and printed before any work. "
        "The artifact is written to a temporary folder and renamed into place only when the "
        "parity gate passed, so a failed or interrupted build leaves nothing behind. MODEL "
        "defaults to the embedded demo model; --target host builds for this CPU (default "
        "backend gguf, run by llama.cpp; --backend onnx, reference, tvm or mlx for the others). "
        "--quant takes a float dtype (f32, f16, bf16) or a preset "
        "(q4_0, q8_0, gptq, awq, marlin, ternary, ...).")
EXAMPLES = [
    "arkinfer build --target host --quant q4_0",
    "arkinfer build ./MiniCPM4.1-8B --target jetson-orin --quant marlin",
    "arkinfer build ./smollm2-hf --target rpi5 --quant q4_0 -o dist/smollm2-rpi5",
    "arkinfer build demo --target host --quant ternary --threshold ppl_delta=2 --json",
    "arkinfer build demo --target host --quant q4_0 --draft eagle3:demo --draft-vocab 640",
]


class StageReporter:
    """Stage lines on stderr with a live status line for the current step; when stderr is not a
    terminal (piped, a CI log) the steps and blocks are plain lines instead."""

    def __init__(self) -> None:
        from arkinfer.pipeline.build import STAGES

        self.stages = STAGES
        self.plain = not err_console.is_terminal
        self.shown = -math.inf  # when the last plain line was printed
        self.status = err_console.status(Text(""))
        self.index = 0
        self.current = ""

    def _show(self, text: str, every: float = 2.0) -> None:
        """The status line; off a terminal a plain line, at most one per `every` seconds."""
        if not self.plain:
            self.status.update(Text(text))
            return
        now = time.perf_counter()
        if now - self.shown >= every:
            self.shown = now
            err_console.print(text, markup=False, highlight=False)

    def __enter__(self):
        if not self.plain:
            self.status.__enter__()
        return self

    def __exit__(self, *exc):
        if not self.plain:
            self.status.__exit__(*exc)

    def stage(self, name: str) -> None:
        self.index = self.stages.index(name) + 1
        self.current = name
        self.t0 = time.perf_counter()
        if not self.plain:  # a piped log gets the stage's line when it is done
            self.status.update(Text(f"[{self.index}/{len(self.stages)}] {name}"))

    def step(self, message: str) -> None:
        self._show(terminal_safe(f"[{self.index}/{len(self.stages)}] {self.current}: {message}"))

    def blocks(self, done: int, total: int, seconds: float) -> None:
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / (done + 1) * (total - done - 1)
        self._show(f"[{self.index}/{len(self.stages)}] quantise: block {done + 1}/{total} "
                   f"({seconds:.1f} s; about {eta:.0f} s left)", every=0.0)

    def stage_done(self, name: str, seconds: float, summary: str = "") -> None:
        err_console.print(f"[green]✓[/] {escape(f'{name:<9}')} {seconds:7.1f} s  "
                          f"{escape(terminal_safe(summary))}", markup=True, highlight=False)


class _Quiet:
    def stage(self, name): ...

    def step(self, message): ...

    def blocks(self, done, total, seconds): ...

    def stage_done(self, name, seconds, summary=""): ...

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


@handle_errors
def command(
    model: Annotated[str, typer.Argument(help="HF folder, .gguf file, or 'demo'.")] = "demo",
    target: TargetOpt = "host",
    quant: QuantOpt = "q4_0",
    backend: BackendOpt = None,
    out: Annotated[Path | None, typer.Option("-o", "--out", help="Artifact folder (default "
                                             "dist/MODEL.TARGET.QUANT).")] = None,
    calib: CalibOpt = None,
    samples: Annotated[int, typer.Option("--samples", help="Calibration sequences.")] = 128,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per calibration sequence.")
                       ] = 512,
    report: Annotated[bool, typer.Option(
        "--report", help="RTN / ternary: calibrate anyway to record each layer's SNR in the "
        "manifest (costs a forward over --samples x --seq-len tokens; e.g. --samples 16 "
        "--seq-len 256). Without it they quantise from the weights alone, in seconds.")] = False,
    threshold: Annotated[list[str] | None, typer.Option(
        "--threshold", help="Override a parity threshold: top1=, kl= or ppl_delta= "
        "(repeatable).")] = None,
    option: Annotated[list[str] | None, typer.Option(
        "--option", help="Backend option KEY=VALUE (repeatable); each backend declares its own "
        "keys, and an unknown key is refused before any work with that backend's list.")] = None,
    draft: Annotated[str | None, typer.Option(
        "--draft", help="A draft carried in the artifact, which run, serve and bench --speculative "
        "then use by default: an EAGLE-3 head's folder (eagle3:PATH; eagle3:demo is the demo's), "
        "'lookup', 'self:N' or a draft artifact's folder (docs/speculative.md).")] = None,
    device: DeviceOpt = "auto",
    draft_vocab: Annotated[int | None, typer.Option(
        "--draft-vocab", min=1, help="FR-Spec: keep only the K tokens most frequent in the "
        "calibration text in the draft head's LM head (e.g. 30 % of the vocabulary); the "
        "target still verifies on the full vocabulary, so output is unchanged.")] = None,
    force: ForceOpt = False,
    json_out: JsonOpt = False,
) -> None:
    from arkinfer.pipeline.build import build
    from arkinfer.pipeline.plan import CalibSettings, resolve_plan
    from arkinfer.pipeline.verify import describe_quality, parse_threshold_overrides

    overrides = parse_threshold_overrides(threshold)
    # KEY=VALUE strings: the plan checks them against the keys the chosen backend declares
    plan = resolve_plan(model, target=target, quant=quant, backend=backend, out=out,
                        calib=CalibSettings(calib, samples, seq_len, report=report,
                                            device=device),
                        options=option or [], force=force, draft=draft,
                        draft_vocab=draft_vocab)
    if not json_out:
        print_kv("build plan", plan.describe())
        for note in plan.notes:
            err_console.print(terminal_safe(f"note: {note}"))
    with (_Quiet() if json_out else StageReporter()) as rep:
        result = build(plan, threshold_overrides=overrides, reporter=rep, force=force)
    m = result.manifest
    if json_out:
        print_json({"path": str(result.path), **m})
        return
    v = m["verification"]["metrics"]
    print_kv(f"built {result.path}", [
        ("backend", m["backend"]["name"]),
        ("quant", m["quant"]["scheme"] + (f" ({m['quant']['bits_per_weight']} bits/weight)"
                                          if m["quant"]["bits_per_weight"] else "")),
        ("weights", f"{m['memory']['weights_bytes'] / 2**20:.1f} MiB"),
        ("verify", (f"passed: top-1 {v['top1_agreement']:.3f}, KL {v['mean_kl']:.4f}, "
                   f"ppl {v['ppl_reference']:.2f} -> {v['ppl_artifact']:.2f} "
                   f"({v['ppl_delta']:+.1%})"
                   + (" vs the float model run dense (this runtime runs dense attention)"
                      if v.get("attention") == "dense" else ""))),
        *([("runtime fidelity", _fidelity(m["verification"]["fidelity"]))]
          if "fidelity" in m["verification"] else []),
        # verify's KL is quantisation + runtime error; this is the quantisation alone (absent
        # for the reference backend, whose runtime is the quantised reference: the same number)
        *([("quantisation alone", "KL vs float on the verify prompts "
            + describe_quality(m["verification"]["fidelity"]["quantisation"]))]
          if "quantisation" in m["verification"].get("fidelity", {}) else []),
        *([("draft", _draft_line(m))] if m.get("draft") else []),
        ("notes", "; ".join(m["backend"]["notes"]) or "-"),
    ])
    console.print(terminal_safe(f"next: arkinfer bench {result.path}"))


def _fidelity(f: dict) -> str:
    return (f"top-1 {f['top1_agreement']:.3f} (>= {f['threshold_top1']}), max |logit diff| "
            f"{f['max_abs_logit_diff']:.3g} vs the reference model on {f['reference_weights']}")


def _draft_line(m: dict) -> str:
    """The carried draft and what verify's speculative check found with it."""
    d, spec = m["draft"], m["verification"].get("speculative", {})
    vocab = (f", draft vocabulary {d['draft_vocab_size']} of {d['vocab_size']}"
             if d.get("draft_vocab_size") else "")
    check = (f"; greedy speculative = plain on the verify prompts, mean accepted length "
             f"{spec['mean_accepted_length']:.2f}" if spec.get("identical") else "")
    return f"{d['source']} ({d['kind']}{vocab}){check}"
