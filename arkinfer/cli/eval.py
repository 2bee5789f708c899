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

HELP = ("Perplexity on a text file. Protocol: tokenize the whole file without BOS, cut it into "
        "consecutive non-overlapping windows of --ctx tokens (a trailing partial window is "
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
    from rich.progress import Progress

    from arkinfer.frontend.checkpoint import load
    from arkinfer.generate import model_logits_fn, perplexity

    if not text.is_file():
        raise ArkError(f"text file {str(text)!r} does not exist", hint="pass --text FILE")
    try:
        content = text.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ArkError(f"{text} is not UTF-8 text: {exc}", hint="convert it to UTF-8") from None
    from arkinfer.pipeline.artifact import is_artifact, load_runner

    if is_artifact(model):
        manifest, runner = load_runner(model)
        if dense and "dense" in runner.attention_modes:
            runner.set_attention("dense")
        ids = runner.tokenize(content)
        logits_fn, where = runner.window_logits, f"{model} ({manifest['backend']['name']} runner)"
    else:
        ckpt, net = load(model, dense=dense, sparse_impl=infllmv2.value)
        if ckpt.tokenizer is None:
            raise ArkError(f"{ckpt.path} has no tokenizer.json", hint="eval needs a tokenizer")
        ids = ckpt.tokenizer.encode(content, add_special_tokens=False)
        logits_fn, where = model_logits_fn(net), str(ckpt.path)
    if max_windows is not None:
        ids = ids[: max_windows * ctx]
    with Progress(console=console, transient=True, disable=json_out) as bar:
        task = bar.add_task("scoring windows", total=None)
        result = perplexity(logits_fn, ids, ctx,
                            progress=lambda done, total: bar.update(task, completed=done, total=total))
    if json_out:
        print_json({"ppl": result.ppl, "tokens": result.tokens, "windows": result.windows,
                    "ctx": ctx, "model": where, "text": str(text)})
    else:
        console.print(f"perplexity {result.ppl:.4f} over {result.tokens} tokens "
                      f"({result.windows} windows of {ctx})")
