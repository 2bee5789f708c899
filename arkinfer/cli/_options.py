"""Option aliases shared by every command so each option is spelled the same everywhere.

Short flags mean one thing in every command: `-t` target, `-q` quant, `-b` backend, `-o` the
folder (or file) a command writes, `-p` prompt(s), `-n` tokens to generate. `bench` spelled its
output format `-o` and its threads `-t` before; those spellings still work for one release and
print a deprecation line (`deprecated_alias`).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

ModelArg = Annotated[
    str,
    typer.Argument(help="A Hugging Face model folder, a .gguf file (imported once into the cache) "
                   "or 'demo' (the embedded demo model, the default)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
TargetOpt = Annotated[str, typer.Option("--target", "-t", help="Target id, alias or a .toml "
                                        "profile (`arkinfer targets`).")]
QuantOpt = Annotated[str, typer.Option(
    "--quant", "-q", help="f32, f16 (fp16), bf16, int4 (the backend's 4-bit preset) or a preset: "
    "q4_0, q4_1, q8_0, gptq, awq, marlin, ternary, mlx4, ort4.")]
BackendOpt = Annotated[str | None, typer.Option("--backend", "-b", help="Backend (default: the "
                                                "target's, or the first of its backends that "
                                                "takes --quant).")]
CalibOpt = Annotated[Path | None, typer.Option(
    "--calib", help="Calibration text: a .txt file, a .jsonl file ('text' or chat 'messages', "
    "rendered through the chat template), a folder (one domain per file), 'prose' (the demo's "
    "English corpus alone) or 'self' (text the model samples itself at temperature 1 from chat, "
    "code, math and BOS seeds, cached per model and --seed in ~/.cache/arkinfer/calib-self; "
    "slow on CPU: e.g. --calib self --samples 32 --seq-len 512), or 'builtin+self' (both, windows "
    "dealt over all their domains). Default: the built-in corpus "
    "(prose, chat, code, technical, legal, math, Chinese, Spanish/German/Italian; "
    "arkinfer/data/calib/).")]
DeviceOpt = Annotated[str, typer.Option(
    "--device", help="Where GPTQ, P-GPTQ and AWQ calibration runs: auto (a CUDA GPU when torch "
    "sees one, else the CPU), cpu, cuda or cuda:N. Blocks stream to the GPU one at a time, so "
    "it needs one block, its activations and Hessians (an 8B model at 128 x 2048 tokens: about "
    "25 GB). RTN / ternary quantise on the CPU from the weights alone. E.g. --device cuda")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing output of the same "
                                        "kind (never a folder ArkInfer did not write).")]


SEED_MAX = 2**64 - 1  # torch.Generator seeds are unsigned 64-bit


def seed_in_range(seed: int) -> int:
    """A `--seed` callback: checked at parse time (a usage error naming the range), not by torch
    later."""
    if not 0 <= seed <= SEED_MAX:
        digits = str(seed)
        shown = digits if len(digits) <= 40 else f"{digits[:20]}... ({len(digits)} digits)"
        raise typer.BadParameter(f"{shown} is outside the valid range 0..{SEED_MAX} "
                                 "(an unsigned 64-bit seed)")
    return seed


def deprecated_alias(old: str, new: str) -> None:
    """Print the one-release deprecation line for an old option spelling (stderr)."""
    from arkinfer.cli._output import err_console

    err_console.print(f"deprecated: {old} is now {new}; the old spelling goes away in the next "
                      "release", markup=False)
DenseOpt = Annotated[
    bool,
    typer.Option("--dense", help="Run dense attention even when the config has a sparse_config."),
]
DraftOpt = Annotated[
    str | None,
    typer.Option("--draft", help="Speculative decoding on an artifact's runtime: 'lookup' (prompt "
                 "lookup, no extra model), 'self:N' (the model's first N layers), an EAGLE-3 "
                 "head's folder (eagle3:PATH; eagle3:demo for the demo model), the folder of a "
                 "draft model's artifact with the same tokenizer, or 'none'. Default: the draft "
                 "the artifact carries (build --draft), if any. Greedy output is plain "
                 "decoding's; sampling keeps its distribution (docs/speculative.md)."),
]
DraftKOpt = Annotated[int, typer.Option("--draft-k", min=1, max=16,
                                        help="Draft tokens per verify step.")]


class InfLLMv2Impl(StrEnum):
    fast = "fast"
    reference = "reference"


SparseImplOpt = Annotated[
    InfLLMv2Impl,
    typer.Option("--infllmv2", help="InfLLM v2 implementation for sparse-config models: the fast "
                 "CPU path or the literal reference (slow; for checking)."),
]
