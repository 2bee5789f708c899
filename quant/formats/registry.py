"""The storage-format registry: every format module registers its instance here at import time.

    from .registry import register     # in a format module: FMT = register(MyFormat())
    get_format("marlin"); all_formats()

A module of its own, below the format modules, so they import it without importing the package
that imports them (`quant/formats/__init__.py` imports every format, which fixes the
registration order, and re-exports these names).
"""

from __future__ import annotations

from .base import Format, FormatError

_REGISTRY: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Add a format instance under `fmt.name` (module import time); names are unique."""
    if fmt.name in _REGISTRY:
        raise ValueError(f"storage format {fmt.name!r} is registered twice")
    _REGISTRY[fmt.name] = fmt
    return fmt


def get_format(name: str) -> Format:
    """The registered format called `name`; FormatError listing the registered ones otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise FormatError(f"unknown storage format {name!r}; registered: {sorted(_REGISTRY)}",
                          "pick one of the registered formats") from None


def all_formats() -> tuple[Format, ...]:
    """Every registered format, in registration order."""
    return tuple(_REGISTRY.values())
