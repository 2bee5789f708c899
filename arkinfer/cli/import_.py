"""`arkinfer import` — a GGUF file (llama.cpp) to a Hugging Face model folder."""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from arkinfer.cli._errors import handle_errors
from arkinfer.cli._options import ForceOpt, JsonOpt
from arkinfer.cli._output import (
    console,
    print_json,
    print_kv,
    progress_bar,
    terminal_safe,
)

HELP = ("Import a GGUF file into a Hugging Face folder (config.json, safetensors, tokenizer.json, "
        "tokenizer_config.json with the chat template, generation_config.json). Weights are "
        "dequantised and llama.cpp's q/k permutation undone; the tokenizer is rebuilt to give "
        "llama.cpp's token ids. Architectures: llama, minicpm, qwen2, qwen3.")
EXAMPLES = [
    "arkinfer import SmolLM2-135M-Instruct.Q4_1.gguf ./smollm2-hf",
    "arkinfer import MiniCPM4-0.5B.Q8_0.gguf ./minicpm4-0.5b --dtype bf16",
    "arkinfer import model.gguf ./model-hf --force --max-shard-size 2GB",
]


class DtypeChoice(str, Enum):
    f32 = "f32"
    bf16 = "bf16"
    f16 = "f16"


_UNITS = {"": 1, "B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3,
          "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3}


def parse_size(text: str) -> int:
    """'5GB' -> 5_000_000_000, '512MiB' -> 536870912, '1000' -> 1000 bytes."""
    from arkinfer.errors import ArkError

    raw = text.strip().upper().replace(" ", "")
    number = raw.rstrip("KMGIB")
    unit = raw[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or value <= 0:
        raise ArkError(f"--max-shard-size {text!r} is not a size",
                       hint="write a number with a unit, e.g. 5GB, 500MB or 2GiB")
    return int(value * _UNITS[unit])


def _progress_bar():
    return progress_bar("dequantising", "name")


@handle_errors
def command(
    gguf_file: Annotated[Path, typer.Argument(help="The .gguf file to import.", show_default=False)],
    out_dir: Annotated[Path, typer.Argument(help="Folder to create (must not exist or be empty).",
                                            show_default=False)],
    dtype: Annotated[DtypeChoice, typer.Option("--dtype", help="Weight dtype of the safetensors.",
                                               case_sensitive=False)] = DtypeChoice.f32,
    force: ForceOpt = False,
    max_shard_size: Annotated[str, typer.Option(
        "--max-shard-size", help="Split weights into shards of at most this size.")] = "5GB",
    json_out: JsonOpt = False,
) -> None:
    from arkinfer.frontend.gguf_import import import_gguf

    shard_bytes = parse_size(max_shard_size)
    start = time.perf_counter()
    if json_out:
        result = import_gguf(gguf_file, out_dir, dtype=dtype.value, force=force,
                             max_shard_bytes=shard_bytes)
    else:
        with _progress_bar() as bar:
            task = bar.add_task("import", total=None, name="reading the GGUF header")

            def progress(done: int, total: int, name: str) -> None:
                bar.update(task, completed=done, total=total, name=terminal_safe(name))

            result = import_gguf(gguf_file, out_dir, dtype=dtype.value, force=force,
                                 max_shard_bytes=shard_bytes, progress=progress)
    seconds = time.perf_counter() - start
    info = {
        "path": str(result.path), "source": str(result.source),
        "architecture": result.architecture, "model_type": result.model_type,
        "parameters": result.parameters, "layers": result.layers, "dtype": result.dtype,
        "tied_embeddings": result.tied_embeddings, "tokenizer": result.tokenizer,
        "source_tensor_types": result.source_types, "files": result.files,
        "bytes": result.bytes, "seconds": round(seconds, 2),
    }
    if json_out:
        print_json(info)
        return
    cfg = result.config
    types = ", ".join(f"{k} x{v}" for k, v in sorted(result.source_types.items()))
    arch = f"{result.architecture} -> {cfg['architectures'][0]} (model_type '{result.model_type}')"
    dims = (f"{result.layers} / {cfg['hidden_size']} / {cfg['num_attention_heads']} q, "
            f"{cfg['num_key_value_heads']} kv")
    shards = len([f for f in result.files if f.endswith(".safetensors")])
    print_kv(f"imported {result.source.name}", [
        ("architecture", arch),
        ("parameters", f"{result.parameters:,} ({result.parameters / 1e6:.1f} M)"),
        ("layers / hidden / heads", dims),
        ("embeddings", "tied (no lm_head.weight)" if result.tied_embeddings else "separate lm_head"),
        ("source tensors", types),
        ("tokenizer", result.tokenizer),
        ("weights", f"{result.dtype}, {result.bytes / 1024**2:.1f} MiB in {shards} file(s)"),
        ("output", f"{result.path}  ({seconds:.1f} s)"),
    ])
    console.print(terminal_safe(f"next: arkinfer inspect {result.path}"))
