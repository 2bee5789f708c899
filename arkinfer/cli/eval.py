"""`arkinfer eval` — perplexity of a model on a text file with a fixed, documented protocol."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from arkinfer.cli._errors import handle_errors
from arkinfer.cli._options import (
    DenseOpt,
    InfLLMv2Impl,
    JsonOpt,
    ModelArg,
    SparseImplOpt,
)
from arkinfer.cli._output import console, print_json
from arkinfer.errors import ArkError

HELP = ("Perplexity on a text file. Protocol: tokenize the whole file without BOS (read and "
        "tokenised piece by piece with the same ids, only as far as --max-windows needs), cut it "
        "into consecutive non-overlapping windows of --ctx tokens (a trailing partial window is "
        "dropped), evaluate each window from an empty cache, score every token of a window except "
        "its first; report exp(mean NLL) and the number of scored tokens. MODEL may also be an "
        "artifact folder from `arkinfer build`: it is then scored by its own Runner (llama.cpp "
        "for gguf, onnxruntime for tensorrt, ...) with its own tokenizer.")
EXAMPLES = [
    "arkinfer eval demo --text arkinfer/data/corpus_eval.txt",
    "arkinfer eval dist/smollm2.rpi5.q8_0 --text arkinfer/data/corpus_eval.txt --ctx 512",
    "arkinfer eval ./smollm2-hf --text wiki.txt --ctx 512 --json",
]


@handle_errors
def command(
    model: ModelArg = "demo",
    text: Annotated[Path, typer.Option("--text", help="UTF-8 text file to score.")] = ...,
    ctx: Annotated[int, typer.Option("--ctx", help="Window length in tokens.")] = 512,
    max_windows: Annotated[int | None, typer.Option(help="Score only the first N windows.")] = None,
    json_out: JsonOpt = False,
    dense: DenseOpt = False,
    infllmv2: SparseImplOpt = InfLLMv2Impl.fast,
) -> None:
    from itertools import chain

    from rich.progress import Progress

    from arkinfer.frontend.checkpoint import check_memory, load, open_checkpoint
    from arkinfer.generate import (
        check_windows,
        model_logits_fn,
        stream_windows,
        window_bytes,
        windows_perplexity,
    )
    from arkinfer.paths import require_regular_file
    from arkinfer.pipeline.artifact import is_artifact, load_runner
    from arkinfer.text_pieces import read_pieces, tokenize_pieces

    check_windows(ctx, max_windows)
    if text.is_dir():
        raise ArkError(f"--text {str(text)!r} is a directory; --text needs a UTF-8 text file",
                       hint="pass a file, e.g. --text arkinfer/data/corpus_eval.txt")
    require_regular_file(text, "--text file")  # before loading anything; read_pieces checks again

    def first_window(tokenize, bytes_per_token: int, where: str):
        """The windows of the text, read and tokenised piece by piece only as far as
        --max-windows needs, after checking the memory of one window (before reading: a text
        of B bytes has at most B + 1 tokens, and a shorter text is one shorter window)."""
        window = min(ctx, text.stat().st_size + 1)
        check_memory(window * bytes_per_token, f"--ctx {ctx} (a window of up to {window} tokens "
                     f"of {where})")
        windows = stream_windows(tokenize_pieces(read_pieces(text, "--text file"), tokenize),
                                 ctx, max_windows)
        return chain([next(windows)], windows)  # a text too short fails here, before the model

    if is_artifact(model):
        manifest, runner = load_runner(model)
        if dense and "dense" in runner.attention_modes:
            runner.set_attention("dense")
        where = f"{model} ({manifest['backend']['name']} runner)"
        windows = first_window(runner.tokenize,
                               window_bytes(int(manifest["tokenizer"].get("vocab_size") or 0),
                                            2 * int(manifest["memory"]["kv_bytes_per_token"])),
                               where)  # the manifest's KV bytes are fp16; the runner's fp32
        logits_fn = runner.window_logits
    else:
        ckpt = open_checkpoint(model)
        cfg = ckpt.config
        if ctx > cfg.max_position_embeddings:
            raise ArkError(f"--ctx {ctx} exceeds max_position_embeddings="
                           f"{cfg.max_position_embeddings} of {ckpt.path}",
                           hint=f"use --ctx {cfg.max_position_embeddings} or less")
        if ckpt.tokenizer is None:
            raise ArkError(f"{ckpt.path} has no tokenizer.json", hint="eval needs a tokenizer")
        tokenizer = ckpt.tokenizer
        where = str(ckpt.path)
        windows = first_window(lambda t: tokenizer.encode(t, add_special_tokens=False),
                               window_bytes(cfg.vocab_size, 8 * cfg.num_hidden_layers *
                                            cfg.num_key_value_heads * cfg.head_dim), where)
        _, net = load(ckpt.path, dense=dense, sparse_impl=infllmv2.value)
        logits_fn = model_logits_fn(net, f"the model {where}")
    with Progress(console=console, transient=True, disable=json_out) as bar:
        task = bar.add_task("scoring windows", total=max_windows)
        result = windows_perplexity(logits_fn, windows, ctx, where=where,
                                    progress=lambda done, _: bar.update(task, completed=done))
    if json_out:
        print_json({"ppl": result.ppl, "tokens": result.tokens, "windows": result.windows,
                    "ctx": ctx, "model": where, "text": str(text)})
    else:
        console.print(f"perplexity {result.ppl:.4f} over {result.tokens} tokens "
                      f"({result.windows} windows of {ctx})")
