"""`arkinfer run` — chat with a model through its chat template, streaming tokens."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.markup import escape

from arkinfer.cli._errors import handle_errors
from arkinfer.cli._options import DenseOpt, InfLLMv2Impl, ModelArg, SparseImplOpt
from arkinfer.cli._output import err_console
from arkinfer.errors import ArkError

HELP = ("Generate a reply with the reference model. The prompt goes through the model's chat "
        "template (ChatML for MiniCPM4.1, reasoning on by default); tokens stream as they come.")
EXAMPLES = [
    'arkinfer run demo -p "What is the capital of France?"',
    'arkinfer run ./smollm2-hf -p "Name three colours." -n 64 --temperature 0',
    'arkinfer run ./MiniCPM4.1-8B -p "Prove that 2+2=4" --no-think',
    'arkinfer run demo -p "The kettle" --raw -n 20',
]


class _Streamer:
    """Decodes the growing id list and prints only the new text (holds back partial UTF-8)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.ids, self.shown = tokenizer, [], ""

    def push(self, token: int) -> None:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        sys.stdout.write(text[len(self.shown):])
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
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    dense: DenseOpt = False,
    infllmv2: SparseImplOpt = InfLLMv2Impl.fast,
) -> None:
    from arkinfer.frontend.checkpoint import load
    from arkinfer.generate import check_sampling, generate

    check_sampling(temperature, top_p)  # before loading a model for minutes
    ckpt, net = load(model, dense=dense, sparse_impl=infllmv2.value)
    tok = ckpt.tokenizer
    if tok is None:
        raise ArkError(f"{ckpt.path} has no tokenizer.json", hint="run needs a tokenizer; "
                       "use a full Hugging Face folder or 'arkinfer import' a GGUF")
    if raw:
        ids = tok.encode(prompt)
    else:
        messages = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": prompt}]
        ids = tok.encode_chat(messages, enable_thinking=False if no_think else None)
    err_console.print(f"[dim]{escape(ckpt.config.model_type)} · {len(ids)} prompt tokens[/]",
                      markup=True)
    streamer = _Streamer(tok)
    for token in generate(net, ids, max_tokens, temperature, top_p, seed, tok.stop_ids,
                          where=f"the model {ckpt.path}"):
        streamer.push(token)
    sys.stdout.write("\n")
