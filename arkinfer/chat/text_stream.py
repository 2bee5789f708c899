"""Token ids to text, piece by piece, as generation produces them.

The whole id list is decoded each time and only the new text is returned: a token can end in
the middle of a UTF-8 character (byte-level BPE, byte fallback), so a piece whose text ends in
U+FFFD is held back until the character is complete.
"""

from __future__ import annotations

from typing import Any


class TextStream:
    """`push(token) -> new text` ("" while a character is incomplete); `text` is all so far.
    `tokenizer` is anything with `decode(ids, skip_special_tokens=...)`; special tokens (a stop
    token) are left out of the text."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.ids, self.text = tokenizer, [], ""

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        new, self.text = text[len(self.text):], text
        return new

    def flush(self) -> str:
        """The text held back at the end (an incomplete character stays U+FFFD)."""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        new, self.text = text[len(self.text):], text
        return new
