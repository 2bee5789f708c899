"""How many positions a chat may use, and the check made before any forward call.

An artifact's context is the smallest of the limits it has: the model's
`max_position_embeddings` (config.json in the artifact, else the GGUF's `{arch}.context_length`,
else the float source's config.json) and the runtime's own KV cache (llama.cpp's `n_ctx`, an
onnx graph's `max_positions`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arkinfer.errors import ArkError

from .tokenizer import artifact_folders


class ContextError(ArkError):
    """The prompt plus the tokens asked for do not fit the context."""


def check_context(prompt_tokens: int, max_tokens: int, context: int, *, flag: str = "-n",
                  limit: str = "the model's context of {context} tokens "
                               "(max_position_embeddings in config.json)") -> None:
    """Raise ContextError unless the prompt and the tokens to generate fit `context`, before any
    forward call: a longer run would be wrong and slow. `flag` names the option that asked for
    the tokens (`-n`, `max_tokens`), `limit` the context ("{context}" is filled in)."""
    if prompt_tokens + max_tokens <= context:
        return
    room = context - prompt_tokens
    raise ContextError(f"the prompt is {prompt_tokens} tokens and {flag} asks for {max_tokens} "
                       f"more: {prompt_tokens + max_tokens} > {limit.format(context=context)}",
                       hint=f"lower {flag} to {room} or less" if room >= 1 else
                       f"shorten the prompt to under {context} tokens (and lower {flag} to fit)")


def _config_positions(folder: Path) -> int | None:
    from arkinfer.frontend.model_folder import read_config

    if not (folder / "config.json").is_file():
        return None
    value = read_config(folder).get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None


def _model_positions(path: Path, manifest: dict[str, Any]) -> tuple[int, str] | None:
    for folder in artifact_folders(path):
        if (n := _config_positions(folder)) is not None:
            return n, f"max_position_embeddings in {folder / 'config.json'}"
    for gguf_path in sorted(path.glob("*.gguf")):
        from arkinfer.frontend.gguf_reader import GGUFFile

        gguf = GGUFFile(gguf_path)
        if (n := gguf.get_int(f"{gguf.arch}.context_length", None)) is not None:
            return n, f"{gguf.arch}.context_length in {gguf_path.name}"
    source = Path(manifest.get("source", {}).get("path", ""))
    if str(source) not in ("", ".") and (n := _config_positions(source)) is not None:
        return n, f"max_position_embeddings in {source / 'config.json'}"
    return None


def _runtime_positions(runner: Any) -> tuple[int, str] | None:
    for attr in ("n_ctx", "max_positions"):
        value = getattr(runner, attr, None)
        if isinstance(value, int) and value > 0:
            return value, f"the runtime's KV cache ({attr})"
    return None


def artifact_context(path: str | Path, manifest: dict[str, Any], runner: Any) -> tuple[int, str]:
    """(positions, what sets that limit) for the artifact at `path` run by `runner`."""
    limits = [lim for lim in (_model_positions(Path(path), manifest), _runtime_positions(runner))
              if lim is not None]
    if not limits:
        raise ArkError(f"artifact {path} records no context length (no config.json with "
                       "max_position_embeddings, no GGUF context_length) and its runtime "
                       "declares none", hint="rebuild the artifact with `arkinfer build`")
    return min(limits)
