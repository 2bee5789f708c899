"""`ChatModel`: a runner with what a chat needs (tokenizer, chat template, stop ids, context).

    model = open_chat_model("dist/demo.host.q4_0")   # an artifact: its own runtime
    model = open_chat_model("demo")                   # a model folder: the reference model
    model = open_chat_model("dist/demo.host.q4_0", draft="lookup", draft_k=4)  # speculative
    ids = model.encode_chat([{"role": "user", "content": "Hi"}], enable_thinking=False)
    ids = model.encode_text("The kettle")

An artifact is opened with `load_runner` (its file hashes checked first); a model folder, a .gguf
file or "demo" runs on ArkInfer's PyTorch reference model (`ReferenceRunner`). With a draft
("lookup", "self:N", an EAGLE-3 head or a draft artifact's folder:
`arkinfer.pipeline.draft.parse_draft`; by default the draft the artifact carries) the model
generates speculatively (docs/speculative.md); a runner that cannot verify drafts is refused here,
before the server starts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arkinfer.errors import TokenizerError
from arkinfer.frontend.tokenizer import Message, TextTokenizer, require_unicode

from .context import artifact_context
from .generation import GenerationSettings, generate_tokens


@dataclass
class ChatModel:
    """name: the id served as the model (the artifact's name, or the folder's); runtime: the
    backend that runs it ("gguf", "reference", ...); context: positions a prompt plus its reply
    may use, and `context_source` what sets that limit; tokenizer_source: where the tokenizer
    came from; draft: the `arkinfer.speculative.Draft` requests are generated with (None: plain
    decoding), proposing `draft_k` tokens per verify step."""

    name: str
    runtime: str
    runner: Any  # arkinfer.backend.Runner
    tokenizer: TextTokenizer
    context: int
    context_source: str
    tokenizer_source: str
    # TextTokenizer.encode flips the tokenizer's encode_special_tokens flag for the call: one
    # encode at a time, or two requests' flags would mix.
    _encode_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    draft: Any = None  # arkinfer.speculative.Draft
    draft_k: int = 4

    @property
    def stop_ids(self) -> frozenset[int]:
        return frozenset(self.tokenizer.stop_ids)

    def encode_chat(self, messages: list[Message], enable_thinking: bool | None = None,
                    special_in_content: bool = False) -> list[int]:
        """Prompt ids of `messages` through the chat template, ready for the assistant's turn.
        Special-token text in a message (a typed `<|im_end|>`) stays plain text unless
        `special_in_content`."""
        for i, message in enumerate(messages):
            require_unicode(message.get("content", ""), f"message {i}'s content")
        with self._encode_lock:
            return self.tokenizer.encode_chat(messages, enable_thinking=enable_thinking,
                                              special_in_content=special_in_content)

    def encode_text(self, text: str, parse_special: bool = False) -> list[int]:
        """Prompt ids of plain `text` (BOS added when the tokenizer adds one), no chat template."""
        require_unicode(text, "the prompt")
        with self._encode_lock:
            return self.tokenizer.encode(text, parse_special=parse_special)


def open_chat_model(target: str | Path, *, dense: bool = False, draft: str | None = None,
                    draft_k: int = 4) -> ChatModel:
    """The artifact folder `target` (it holds arkinfer.json) on its own runtime, else the model
    folder, .gguf file or "demo" `target` on the reference model. `dense`: dense attention on
    InfLLM v2 models (NotAvailableError from a runtime that cannot switch). `draft`: generate
    speculatively with that draft, `draft_k` tokens per step (see `attach_draft`); None: the
    draft the artifact carries (`build --draft`), if any; "none": plain decoding."""
    from arkinfer.pipeline.artifact import is_artifact

    if is_artifact(target):
        model = _open_artifact(Path(target), dense)
        if draft is None:
            _attach_carried_draft(model, Path(target), draft_k)
    else:
        model = _open_model(str(target), dense)
    if draft not in (None, "none"):
        attach_draft(model, draft, draft_k)
    return model


def _attach_carried_draft(model: ChatModel, path: Path, k: int) -> None:
    """The artifact's own draft (manifest["draft"]), where it has one its runner can run."""
    from arkinfer.pipeline import manifest as mf
    from arkinfer.pipeline.draft_artifact import artifact_draft
    from arkinfer.speculative.engine import check_target

    manifest = mf.read_manifest(path)
    if manifest.get("draft"):
        check_target(model.runner, k)
        model.draft, model.draft_k = artifact_draft(path, manifest, model.runner), k


def attach_draft(model: ChatModel, spec: str, k: int) -> None:
    """Make `model` generate speculatively with the draft `spec` names ("lookup", "self:N" or a
    draft artifact's folder), `k` tokens per verify step. NotAvailableError when its runner
    cannot extend and truncate its KV cache; ArkError for a bad `spec` or k < 1."""
    from arkinfer.pipeline.draft import parse_draft
    from arkinfer.speculative.engine import check_target

    check_target(model.runner, k)  # before a draft model is loaded for nothing
    model.draft, model.draft_k = parse_draft(spec, model.runner), k


def _open_artifact(path: Path, dense: bool) -> ChatModel:
    from arkinfer.pipeline.artifact import load_runner

    from .tokenizer import artifact_tokenizer

    manifest, runner = load_runner(path)
    if dense:
        runner.set_attention("dense")
    tokenizer, tokenizer_source = artifact_tokenizer(path, manifest, runner.vocab_size)
    context, context_source = artifact_context(path, manifest, runner)
    return ChatModel(str(manifest.get("name") or path.name), manifest["backend"]["name"], runner,
                     tokenizer, context, context_source, tokenizer_source)


def _open_model(target: str, dense: bool) -> ChatModel:
    from arkinfer.pipeline.reference_runner import ReferenceRunner

    runner = ReferenceRunner(target, dense=dense)
    ckpt = runner.ckpt
    if ckpt.tokenizer is None:
        raise TokenizerError(f"{ckpt.path} has no tokenizer.json",
                             hint="chat needs a tokenizer; use a full Hugging Face folder or "
                             "'arkinfer import' a GGUF")
    name = "demo" if target == "demo" else Path(ckpt.path).name
    return ChatModel(name, "reference", runner, ckpt.tokenizer,
                     int(ckpt.config.max_position_embeddings),
                     f"max_position_embeddings in {Path(ckpt.path) / 'config.json'}",
                     f"{Path(ckpt.path) / 'tokenizer.json'}")


def model_tokens(model: ChatModel, ids: list[int], settings: GenerationSettings,
                 cancelled: Callable[[], bool] = lambda: False,
                 stats=None) -> Iterator[int]:
    """Token ids from a `ChatModel`'s runner (`run` and `serve`): plain decoding, or speculative
    decoding with `model.draft` when it has one (`stats`: a SpecStats it fills in); a stop id is
    yielded, then generation ends. `cancelled()` is asked after each token (a client that went
    away)."""
    if model.draft is None:
        yield from generate_tokens(model.runner, ids, settings, model.stop_ids,
                                   where=f"the {model.runtime} runtime of {model.name}",
                                   cancelled=cancelled)
        return
    from arkinfer.speculative import speculative_generate

    settings.check()
    for token in speculative_generate(model.runner, model.draft, ids, settings.max_tokens,
                                      k=model.draft_k, temperature=settings.temperature,
                                      top_p=settings.top_p, seed=settings.seed,
                                      stop_ids=model.stop_ids, stats=stats):
        yield token
        if cancelled():
            return
