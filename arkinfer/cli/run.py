"""`arkinfer run` — chat with a model through its chat template, streaming tokens."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.markup import escape

from arkinfer.cli._errors import handle_errors
from arkinfer.cli._options import DenseOpt, InfLLMv2Impl, ModelArg, SparseImplOpt, seed_in_range
from arkinfer.cli._output import err_console, terminal_safe
from arkinfer.errors import ArkError

HELP = ("Generate a reply with the reference model. The prompt goes through the model's chat "
        "template (ChatML for MiniCPM4.1, reasoning on by default); tokens stream as they come. "
        "Special-token text typed in the prompt or --system (e.g. <|im_end|>) is plain text, "
        "not a special token, unless --raw-special is given; the template's own special tokens "
        "always work. The prompt plus -n must fit the model's context "
        "(max_position_embeddings).")
EXAMPLES = [
    'arkinfer run demo -p "What is the capital of France?"',
    'arkinfer run ./smollm2-hf -p "Name three colours." -n 64 --temperature 0',
    'arkinfer run ./MiniCPM4.1-8B -p "Prove that 2+2=4" --no-think',
    'arkinfer run demo -p "The kettle" --raw -n 20',
]



def check_context(prompt_tokens: int, max_tokens: int, context: int) -> None:
    """Raise ArkError unless the prompt and the tokens to generate fit the model's context
    (`max_position_embeddings`), before any forward call: a longer run would be wrong and slow."""
    if prompt_tokens + max_tokens <= context:
        return
    room = context - prompt_tokens
    raise ArkError(f"the prompt is {prompt_tokens} tokens and -n asks for {max_tokens} more: "
                   f"{prompt_tokens + max_tokens} > the model's context of {context} tokens "
                   "(max_position_embeddings in config.json)",
                   hint=f"lower -n to {room} or less" if room >= 1 else
                   f"shorten the prompt to under {context} tokens (and lower -n to fit)")


class _Streamer:
    """Decodes the growing id list and prints only the new text (holds back partial UTF-8)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.ids, self.shown = tokenizer, [], ""

    def push(self, token: int) -> None:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        # The vocabulary comes from the model folder: control characters (ESC ...) it decodes to
        # are shown as escapes; newlines and tabs are the reply's own.
        sys.stdout.write(terminal_safe(text[len(self.shown):], keep="\n\t"))
        sys.stdout.flush()
        self.shown = text


@handle_errors
def command(
    model: ModelArg = "demo",
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
) -> None:
    from arkinfer.frontend.checkpoint import load
    from arkinfer.frontend.tokenizer import require_unicode
    from arkinfer.generate import check_sampling, generate

    check_sampling(temperature, top_p)  # before loading a model for minutes
    for flag, text in (("-p/--prompt", prompt), ("--system", system or "")):
        require_unicode(text, flag)  # before loading the model
    ckpt, net = load(model, dense=dense, sparse_impl=infllmv2.value)
    tok = ckpt.tokenizer
    if tok is None:
        raise ArkError(f"{ckpt.path} has no tokenizer.json", hint="run needs a tokenizer; "
                       "use a full Hugging Face folder or 'arkinfer import' a GGUF")
    if raw:
        ids = tok.encode(prompt, parse_special=raw_special)
    else:
        messages = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": prompt}]
        ids = tok.encode_chat(messages, enable_thinking=False if no_think else None,
                              special_in_content=raw_special)
    check_context(len(ids), max_tokens, ckpt.config.max_position_embeddings)
    err_console.print(f"[dim]{escape(terminal_safe(ckpt.config.model_type))} · {len(ids)} "
                      "prompt tokens[/]", markup=True)
    streamer = _Streamer(tok)
    try:
        for token in generate(net, ids, max_tokens, temperature, top_p, seed, tok.stop_ids,
                              where=f"the model {ckpt.path}"):
            streamer.push(token)
    finally:  # also before an error in a decode step, which then starts its own line
        sys.stdout.write("\n")
        sys.stdout.flush()
