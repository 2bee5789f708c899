"""The backend registry: backends register in the `arkinfer.backends` entry-point group.

Each entry point names an object with the `Backend` protocol, e.g. in a third party's
pyproject.toml:

    [project.entry-points."arkinfer.backends"]
    mybackend = "my_package.backend:BACKEND"

Entry points are only imported when a backend is asked for by name, so listing backends never
imports a backend SDK. The protocol grows with the pipeline (lower / load arrive with `build`).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Protocol, runtime_checkable

from arkinfer.errors import NotAvailableError

GROUP = "arkinfer.backends"


@runtime_checkable
class Backend(Protocol):
    name: str

    def available(self) -> bool:
        """True when every toolchain this backend needs on this machine is importable."""

    def install_hint(self) -> str:
        """The command that makes `available()` true (shown to users when it is not)."""


@dataclass(frozen=True)
class BackendStatus:
    name: str
    available: bool
    install_hint: str


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=GROUP)}


def backend_names() -> list[str]:
    """Registered backend names (nothing is imported)."""
    return sorted(_entry_points())


def get_backend(name: str) -> Backend:
    """The backend registered as `name`, imported now; unknown names list the registered ones."""
    eps = _entry_points()
    if name not in eps:
        raise NotAvailableError(f"backend {name!r} is not registered",
                                hint=f"registered backends: {', '.join(sorted(eps)) or 'none'}; "
                                "a backend registers in the 'arkinfer.backends' entry-point group")
    backend = eps[name].load()
    if not isinstance(backend, Backend):
        raise NotAvailableError(f"entry point {eps[name].value!r} of backend {name!r} does not "
                                "provide name, available() and install_hint()",
                                hint="fix the backend package's entry point")
    return backend


def backend_status() -> list[BackendStatus]:
    """Every registered backend with whether it is usable here and how to install it."""
    out = []
    for name in backend_names():
        backend = get_backend(name)
        out.append(BackendStatus(name, backend.available(), backend.install_hint()))
    return out
