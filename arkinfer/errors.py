"""Errors a user can act on.

Every error names the object, the bad value, what is allowed and the next step. The CLI turns an
`ArkError` into a message plus a hint (no traceback unless `ARKINFER_DEBUG=1`); library code raises,
it never prints or exits.
"""

from __future__ import annotations


class ArkError(Exception):
    """Base class: `message` says what is wrong, `hint` says what to do next."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"


class ConfigError(ArkError):
    """config.json (or another JSON/TOML input) is malformed or has unsupported values."""


class CheckpointError(ArkError):
    """A checkpoint folder or weight file cannot be read or does not match the model."""


class TokenizerError(ArkError):
    """The tokenizer or chat template cannot be loaded or rendered."""


class GGUFError(ArkError):
    """A GGUF file cannot be read or imported."""


class TargetError(ArkError):
    """A target profile is unknown or invalid."""


class NotAvailableError(ArkError):
    """A feature or optional dependency is not available in this installation."""
