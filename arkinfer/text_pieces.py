"""Tokenise a long text piece by piece, with the ids a whole-text tokenisation would give.

A `tokenizers` encoding holds offsets, strings and masks per token: about 185 bytes of memory per
input byte, so a 50 MB `eval --text` took 9 GB before its first window. Here the text is read and
tokenised in pieces of about `CHUNK_CHARS` characters, so memory stays bounded by the piece, and a
reader that needs only the first N tokens (`eval --max-windows`) reads only the start of the file.

Where a piece may end: at the start of a line (after a newline, before a non-space character),
else before a space between two words. Every tokenizer ArkInfer runs splits there (byte-level BPE
pre-tokenizers, SentencePiece's metaspace, llama.cpp's), but two things differ between a piece and
the whole text, and both are handled:
- the start of a string is special to some tokenizers (SentencePiece prepends "▁", llama.cpp adds
  a space prefix): every piece after the first is tokenised behind `CONTEXT_CHARS` characters of
  the text before it, whose own tokens are then dropped;
- a cut must not fall inside a token: each candidate cut is tried on `LOOKAHEAD_CHARS` around it,
  and taken only when the text before it tokenises the same with and without the text after.
tests/safety/test_bounded_inputs.py checks the pieces against whole-text tokenisation on the
project corpora with several tokenizer kinds.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from arkinfer.errors import ArkError
from arkinfer.paths import open_regular

Tokenize = Callable[[str], list[int]]

CHUNK_CHARS = 1 << 18       # ~256 KiB of text per tokenize call (~50 MB of transient encoding)
CONTEXT_CHARS = 64          # left context a piece is tokenised behind
LOOKAHEAD_CHARS = 256       # right context a cut is checked with
MAX_PENDING_CHARS = 64 * CHUNK_CHARS  # text with no usable cut in 16 Mi characters is refused
_CANDIDATES = 16            # cuts tried per kind (line start, word start) in each new region


def read_pieces(path: Path, what: str, piece_chars: int | None = None) -> Iterator[str]:
    """The UTF-8 text of regular file `path` in pieces of `piece_chars` (default CHUNK_CHARS)
    characters, with universal newlines (as `Path.read_text`); ArkError naming `what` for
    anything else."""
    piece_chars = piece_chars or CHUNK_CHARS
    with open_regular(path, what) as raw, \
            io.TextIOWrapper(raw, encoding="utf-8", newline=None) as fh:
        while True:
            try:
                piece = fh.read(piece_chars)
            except UnicodeDecodeError as exc:  # exc.object: the bytes read last (+ a tail)
                at = raw.tell() - len(exc.object) + exc.start
                raise ArkError(f"{what} {path} is not UTF-8 text: {exc.reason} at byte {at}",
                               hint="convert it to UTF-8") from None
            except OSError as exc:
                raise ArkError(f"{what} {path} cannot be read: {exc.strerror or exc}",
                               hint="check the file and the disk") from None
            if not piece:
                return
            yield piece


def _line_start(text: str, i: int) -> int | None:
    """The cut after the newline at `i` when a non-space character follows it."""
    return i + 1 if not text[i + 1].isspace() else None


def _word_start(text: str, i: int) -> int | None:
    """The cut before the space at `i` when non-space characters are on both sides of it."""
    return i if not (text[i - 1].isspace() or text[i + 1].isspace()) else None


def _candidates(text: str, lo: int, hi: int) -> Iterator[int]:
    """Cut positions in (lo, hi], latest first: line starts, then word starts (`hi` is at least
    one character before the end of `text`); at most `_CANDIDATES` of each."""
    for sep, cut_at in (("\n", _line_start), (" ", _word_start)):
        end, found = hi, 0
        while found < _CANDIDATES and (i := text.rfind(sep, lo, end)) > lo:
            if (cut := cut_at(text, i)) is not None:
                found += 1
                yield cut
            end = i


def _stable(tokenize: Tokenize, text: str, cut: int) -> bool:
    """Whether the text before `cut` tokenises the same with and without the text after it."""
    left = text[max(0, cut - CONTEXT_CHARS):cut]
    head = tokenize(left)
    return tokenize(left + text[cut:cut + LOOKAHEAD_CHARS])[:len(head)] == head


class _Pieces:
    """The state between pieces: what was tokenised last and the text to tokenise behind."""

    def __init__(self, tokenize: Tokenize) -> None:
        self.tokenize, self.context, self.done = tokenize, None, 0

    def ids(self, piece: str) -> list[int]:
        """Ids of `piece`, the text after everything tokenised so far."""
        if self.context is None:
            ids = self.tokenize(piece)
        else:
            head = self.tokenize(self.context)
            ids = self.tokenize(self.context + piece)
            if ids[:len(head)] != head:
                raise ArkError(f"the text cannot be tokenised in pieces at character {self.done:,} "
                               "(a token spans the cut)",
                               hint="break the text into shorter lines")
            ids = ids[len(head):]
        self.context = ((self.context or "") + piece[-CONTEXT_CHARS:])[-CONTEXT_CHARS:]
        self.done += len(piece)
        return ids


def tokenize_pieces(texts: Iterable[str], tokenize: Tokenize,
                    chunk_chars: int | None = None) -> Iterator[list[int]]:
    """The ids of the text `"".join(texts)`, piece by piece: their concatenation equals
    `tokenize` of the whole text. Each piece is at most `chunk_chars` (default CHUNK_CHARS)
    characters where the text has a cut in every `chunk_chars`; `texts` is read lazily (stop
    iterating and the rest is never read)."""
    chunk_chars = chunk_chars or CHUNK_CHARS
    state, buf, start, scanned = _Pieces(tokenize), "", 0, 0  # buf[start:] is not tokenised yet
    for text in texts:
        buf, scanned, start = buf[start:] + text, scanned - start, 0
        while len(buf) - LOOKAHEAD_CHARS >= scanned + chunk_chars:
            lo = scanned
            scanned = lo + chunk_chars
            cut = next((c for c in _candidates(buf, lo, scanned) if _stable(tokenize, buf, c)),
                       None)
            if cut is not None:
                yield state.ids(buf[start:cut])
                start = scanned = cut
            elif scanned - start > MAX_PENDING_CHARS:
                raise ArkError(f"the text has no line break or space to tokenise it at in "
                               f"{scanned - start:,} characters after character {state.done:,}",
                               hint="break the text into lines")
    if start < len(buf):
        yield state.ids(buf[start:])
