"""Errors of the graph IR. Each names the graph, the node or weight, and the next step."""

from __future__ import annotations

from arkinfer.errors import ArkError


class IRError(ArkError):
    """Base class of every IR error."""


class IRVerifyError(IRError):
    """A graph breaks an IR rule (types, shapes, use before definition, missing weight, ...)."""


class UnsupportedOpError(IRError):
    """Lowering met an ATen (or custom) op the IR has no lowering for."""


class TraceError(IRError):
    """torch.export could not capture an entry point as the IR needs it."""


class InterpretError(IRError):
    """Inputs given to the interpreter do not match the entry point, or an op cannot run."""


class SchemaError(IRError):
    """A serialised program is malformed or has an unknown schema version."""
