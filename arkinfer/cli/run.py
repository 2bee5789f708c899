"""`arkinfer run` — chat with a model through its chat template, streaming tokens."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.markup import escape

from arkinfer.chat.context import check_context
from arkinfer.chat.text_stream import TextStream
from arkinfer.cli._errors import handle_errors
from arkinfer.cli._options import (
    DenseOpt,
    DraftKOpt,
    DraftOpt,
    InfLLMv2Impl,
    SparseImplOpt,
    seed_in_range,
)
from arkinfer.cli._output import err_console, terminal_safe
from arkinfer.errors import ArkError

HELP = ("Generate a reply with a model or a built artifact. A model folder, a .gguf file or "
        "'demo' runs on the reference model; an artifact folder (with arkinfer.json, from "
        "`arkinfer build`) runs on its own runtime (llama.cpp, onnxruntime, MLX, ...) with its "
        "own tokenizer and chat template; stderr names the runtime. The prompt goes through the "
        "chat template (ChatML for MiniCPM4.1, reasoning on by default); tokens stream as they "
        "come. Special-token text typed in the prompt or --system (e.g. <|im_end|>) is plain "
        "text, not a special token, unless --raw-special is given; the template's own special "
        "tokens always work. The prompt plus -n must fit the context (max_position_embeddings, "
        "and an artifact's runtime cache).")
EXAMPLES = [
    'arkinfer run demo -p "What is the capital of France?"',
    'arkinfer run dist/demo.host.q4_0 -p "What is bread made from?"',
    'arkinfer run ./smollm2-hf -p "Name three colours." -n 64 --temperature 0',
    'arkinfer run ./MiniCPM4.1-8B -p "Prove that 2+2=4" --no-think',
    'arkinfer run demo -p "The kettle" --raw -n 20',
    'arkinfer run dist/demo.host.q4_0 -p "Repeat: the cat sat on the mat." --draft lookup',
]


class _Streamer:
    """Prints the new text of each token as it comes (holds back partial UTF-8)."""

    def __init__(self, tokenizer) -> None:
        self.text = TextStream(tokenizer)

    def push(self, token: int) -> None:
        # The vocabulary comes from the model folder: control characters (ESC ...) it decodes to
        # are shown as escapes; newlines and tabs are the reply's own.
        piece = self.text.push(token)
        if piece:
            sys.stdout.write(terminal_safe(piece, keep="\n\t"))
            sys.stdout.flush()


def _prompt_ids(tok, prompt: str, system: str | None, raw: bool, raw_special: bool,
                no_think: bool) -> list[int]:
    if raw:
        return tok.encode(prompt, parse_special=raw_special)
    messages = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": prompt}]
    return tok.encode_chat(messages, enable_thinking=False if no_think else None,
                           special_in_content=raw_special)


def _stream(tokens, tok) -> None:
    streamer = _Streamer(tok)
    try:
        for token in tokens:
            streamer.push(token)
    finally:  # also before an error in a decode step, which then starts its own line
        sys.stdout.write("\n")
        sys.stdout.flush()


def _run_artifact(path: str, ids_of, settings, dense: bool, infllmv2: InfLLMv2Impl,
                  draft: str | None = None, draft_k: int = 4) -> None:
    """Generate with the artifact at `path` on its own runtime (speculatively with `draft`)."""
    from arkinfer.chat.model import model_tokens, open_chat_model
    from arkinfer.speculative import SpecStats

    if infllmv2 is not InfLLMv2Impl.fast:
        raise ArkError("--infllmv2 picks the reference model's InfLLM v2 implementation; an "
                       "artifact runs the attention its runtime was built with",
                       hint="drop --infllmv2, or run the model folder instead of the artifact")
    model = open_chat_model(path, dense=dense, draft=draft, draft_k=draft_k)
    ids = ids_of(model.tokenizer)
    check_context(len(ids), settings.max_tokens, model.context,
                  limit="the artifact's context of {context} tokens, set by "
                  + model.context_source)
    err_console.print(f"[dim]{escape(terminal_safe(model.name))} · {len(ids)} prompt tokens · "
                      f"{escape(terminal_safe(model.runtime))} runtime (artifact)[/]", markup=True)
    stats = SpecStats()
    _stream(model_tokens(model, ids, settings, stats=stats), model.tokenizer)
    if model.draft is not None:
        err_console.print(f"[dim]speculative ({escape(model.draft.name)}, k={draft_k}): "
                          f"{stats.steps} "
                          f"verify steps, mean accepted length {stats.mean_accepted_length:.2f}, "
                          f"{stats.accepted}/{stats.drafted} draft tokens accepted[/]",
                          markup=True)


@handle_errors
def command(
    model: Annotated[str, typer.Argument(help="A built artifact folder (with arkinfer.json), "
                                         "a Hugging Face model folder, a .gguf file or 'demo' "
                                         "(the embedded demo model, the default).")] = "demo",
    prompt: Annotated[str, typer.Option("-p", "--prompt", help="The user message.")] = "Hello!",
    max_tokens: Annotated[int, typer.Option("-n", "--max-tokens", min=1, help="Tokens to generate.")] = 128,
    temperature: Annotated[float, typer.Option(help="0 = greedy (>= 0). MiniCPM4.1 recommends 0.6.")] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass, in (0, 1].")] = 0.95,
    no_think: Annotated[bool, typer.Option("--no-think", help="Fast mode: enable_thinking=False in the template.")] = False,
    system: Annotated[str | None, typer.Option(help="Optional system message.")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Continue the prompt as plain text, no chat template.")] = False,
    raw_special: Annotated[bool, typer.Option(
        "--raw-special", help="Parse special-token text typed in the prompt and --system (e.g. "
        "<|im_end|>) as special tokens. Without it they are plain text.")] = False,
    seed: Annotated[int, typer.Option(help="Sampling seed, 0..2^64-1.",
                                      callback=seed_in_range)] = 0,
    dense: DenseOpt = False,
    infllmv2: SparseImplOpt = InfLLMv2Impl.fast,
    draft: DraftOpt = None,
    draft_k: DraftKOpt = 4,
) -> None:
    from arkinfer.chat.generation import GenerationSettings
    from arkinfer.frontend.tokenizer import require_unicode
    from arkinfer.generate import check_sampling, generate
    from arkinfer.pipeline.artifact import is_artifact

    check_sampling(temperature, top_p)  # before loading a model for minutes
    for flag, text in (("-p/--prompt", prompt), ("--system", system or "")):
        require_unicode(text, flag)  # before loading the model

    def ids_of(tok) -> list[int]:
        return _prompt_ids(tok, prompt, system, raw, raw_special, no_think)

    if is_artifact(model):
        _run_artifact(model, ids_of, GenerationSettings(max_tokens, temperature, top_p, seed),
                      dense, infllmv2, draft, draft_k)
        return
    if draft not in (None, "none"):
        raise ArkError(f"--draft {draft!r} speculates on an artifact's runtime; {model!r} is "
                       "not an artifact folder", hint="build one first (arkinfer build MODEL "
                       "--target host) and run the artifact folder with --draft")
    from arkinfer.frontend.checkpoint import load

    ckpt, net = load(model, dense=dense, sparse_impl=infllmv2.value)
    tok = ckpt.tokenizer
    if tok is None:
        raise ArkError(f"{ckpt.path} has no tokenizer.json", hint="run needs a tokenizer; "
                       "use a full Hugging Face folder or 'arkinfer import' a GGUF")
    ids = ids_of(tok)
    check_context(len(ids), max_tokens, ckpt.config.max_position_embeddings)
    err_console.print(f"[dim]{escape(terminal_safe(ckpt.config.model_type))} · {len(ids)} "
                      "prompt tokens · reference model[/]", markup=True)
    _stream(generate(net, ids, max_tokens, temperature, top_p, seed, tok.stop_ids,
                     where=f"the model {ckpt.path}"), tok)
