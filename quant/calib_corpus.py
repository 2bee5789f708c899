"""Where calibration text comes from: the built-in multi-domain corpus, a folder of the user's
files (one domain each), or one file; and how chats become text.

    domains = calibration_domains(None)           # the built-in corpus, nine domains
    domains = calibration_domains("prose")        # corpus_train.txt alone (the old default)
    domains = calibration_domains("./my-calib/")  # every .txt / .jsonl / .ndjson in the folder
    domains = calibration_domains("notes.jsonl")  # one file, one domain
    # --calib self: the model writes the text (quant/calib_self.py, via load_calibration)

The built-in corpus (`arkinfer/data/calib/`, licences in its README.md) covers what the models
ArkInfer targets read: English prose (`corpus_train.txt`), chat (English and Chinese, rendered
through the model's own chat template), Python code, technical documentation, legal text,
worked mathematics, Chinese prose and Spanish, German and Italian prose. GPTQ fitted on one
domain fits that domain: on SmolLM2-135M, prose-only calibration beat plain RTN on prose and lost
to it on held-out legal text (BENCHMARKS.md, "Quantisation quality"). Windows are drawn from
every domain alike (`quant.calib_data.load_calibration`), so no domain's size decides the mix.

A `.jsonl` record is `{"text": ...}` or a chat `{"messages": [{"role", "content"}, ...]}`; a
chat is rendered with the tokenizer's chat template (no generation prompt), or as
"role: content" lines when the model has none.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import arkinfer.data
from arkinfer.paths import decode_text, read_limited

from .weight import QuantError

DATA = Path(arkinfer.data.__file__).resolve().parent
PROSE_TEXT = DATA / "corpus_train.txt"
BUILTIN = {  # domain -> file; the order is the order windows are dealt in
    "prose": PROSE_TEXT,
    "dialogue": DATA / "calib" / "dialogue.jsonl",
    "code": DATA / "calib" / "code.txt",
    "technical": DATA / "calib" / "technical.txt",
    "legal": DATA / "calib" / "legal.txt",
    "math": DATA / "calib" / "math.txt",
    "chinese": DATA / "calib" / "chinese.txt",
    "chinese-dialogue": DATA / "calib" / "chinese_dialogue.jsonl",
    "european": DATA / "calib" / "european.txt",
}
NAMED = {"builtin": BUILTIN, "prose": {"prose": PROSE_TEXT}}
SELF = "self"  # --calib self: sampled from the model itself (quant/calib_self.py)
BUILTIN_SELF = "builtin+self"  # the built-in corpus's domains, then the self-sampled ones
SUFFIXES = (".txt", ".jsonl", ".ndjson")
JSONL = (".jsonl", ".ndjson")
#: A --calib file holds far more text than calibration uses (--samples x --seq-len tokens,
#: 65,536 by default: about 300 KB of English); the bound keeps /dev/zero or a disk image out.
CALIB_MAX_BYTES = 32 << 20
MAX_DOMAINS = 64

RenderChat = Callable[[list[dict]], str]


@dataclass(frozen=True)
class Domain:
    """One domain of calibration text: its name, its file, the file's bytes.

    `ids`: token id sequences the text already is (text the model wrote, `quant.calib_self`):
    used as they are, never decoded and tokenised again (that round trip is not exact). `raw`
    then holds the JSON Lines records of those sequences, so `sha256` names the text used."""

    name: str
    path: Path
    raw: bytes
    ids: tuple[tuple[int, ...], ...] | None = None

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()

    def texts(self, render_chat: RenderChat | None = None) -> list[str]:
        return read_texts(self.path, self.raw, render_chat)


def is_self(calib: str | Path | None) -> bool:
    """True for `--calib self` and `--calib builtin+self` (text the model writes,
    `quant.calib_self`, alone or after the built-in corpus); a path wins."""
    return (calib is not None and str(calib) in (SELF, BUILTIN_SELF)
            and not Path(calib).exists())


def calibration_domains(calib: str | Path | None) -> list[Domain]:
    """The domains of `--calib` (None: the built-in corpus), every file read and bounded.
    `self` is refused here: the model writes that text (`load_calibration(..., checkpoint=)`)."""
    if is_self(calib):
        raise QuantError("--calib self is text the model writes itself; it needs the model, "
                         "not a file", "call load_calibration(tokenizer, 'self', ..., "
                         "checkpoint=ckpt), or name a calibration file")
    if calib is None or (str(calib) in NAMED and not Path(calib).exists()):  # a path wins
        files = NAMED["builtin" if calib is None else str(calib)]
        return [Domain(name, path, _read(path)) for name, path in files.items()]
    path = Path(calib)
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.suffix.lower() in SUFFIXES)
        if not found:
            raise QuantError(f"--calib {path} is a folder with no {', '.join(SUFFIXES)} file",
                             "put one file per domain in it (plain text, or JSON Lines with "
                             "'text' or 'messages'), or name one file")
        if len(found) > MAX_DOMAINS:
            raise QuantError(f"--calib {path} holds {len(found)} files; at most {MAX_DOMAINS} "
                             "domains", "merge files of one domain into one file")
        return [Domain(p.stem, p, _read(p)) for p in found]
    return [Domain(path.stem, path, _read(path))]


def _read(path: Path) -> bytes:
    """A --calib file's bytes: a regular file of at most CALIB_MAX_BYTES (QuantError naming what
    the path is otherwise: missing, a directory, a FIFO, a device, too large)."""
    return read_limited(path, "calibration file", CALIB_MAX_BYTES, QuantError,
                        hint=f"calibration uses only --samples x --seq-len tokens: pass an excerpt "
                        f"of at most {CALIB_MAX_BYTES >> 20} MiB")


def read_texts(path: Path, raw: bytes | None = None,
               render_chat: RenderChat | None = None) -> list[str]:
    """Plain text -> [whole file]; .jsonl -> one text per record ("text", or "messages" rendered
    by `render_chat`, else as "role: content" lines). `raw`: the file's bytes when read."""
    path = Path(path)
    text = decode_text(_read(path) if raw is None else raw, path, "calibration file", QuantError)
    if path.suffix.lower() not in JSONL:
        return [text]
    texts = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            texts.append(_record_text(line, n, path, render_chat))
    if not texts:
        raise QuantError(f"{path} holds no records", "add lines like {\"text\": \"...\"}")
    return texts


def _record_text(line: str, n: int, path: Path, render_chat: RenderChat | None) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise QuantError(f"line {n} of {path} is not JSON: {exc}",
                         "write one JSON object per line") from None
    if isinstance(record, dict) and isinstance(record.get("text"), str):
        return record["text"]
    messages = record.get("messages") if isinstance(record, dict) else None
    if isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in messages):
        if render_chat is not None:
            return render_chat(messages)
        return "\n".join(f"{m['role']}: {m['content']}" for m in messages)
    keys = sorted(record) if isinstance(record, dict) else type(record).__name__
    raise QuantError(f"line {n} of {path} has neither a string 'text' nor a 'messages' list of "
                     f"{{role, content}} (keys: {keys})",
                     "give every record a 'text' field or a 'messages' chat")


def chat_renderer(tokenizer) -> RenderChat | None:
    """The tokenizer's chat template as a renderer (no generation prompt), or None."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    return lambda messages: tokenizer.render_chat(messages, add_generation_prompt=False)
