"""Backends are found through the `arkinfer.backends` entry-point group and loaded lazily."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from arkinfer.backend import Backend, backend_names, backend_status, get_backend
from arkinfer.errors import NotAvailableError


def test_gguf_backend_is_registered_and_reports_its_toolchain():
    assert "gguf" in backend_names()
    backend = get_backend("gguf")
    assert isinstance(backend, Backend) and backend.name == "gguf"
    has_toolchain = all(importlib.util.find_spec(m) for m in ("gguf", "llama_cpp"))
    assert backend.available() == bool(has_toolchain)
    assert "arkinfer[gguf]" in backend.install_hint()
    assert [s.name for s in backend_status()] == backend_names()


def test_unknown_backend_lists_registered_ones():
    with pytest.raises(NotAvailableError) as err:
        get_backend("tensorrtt")
    assert "gguf" in err.value.hint


def test_listing_backends_imports_no_backend_module():
    code = ("import sys; from arkinfer.backend import backend_names; backend_names(); "
            "print(any(m.startswith('arkinfer.backends.gguf') or m == 'llama_cpp' for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
