"""Collects the implementations under test: every tests/conformance/impls/*.py that defines
`IMPL` (an `infllmv2_checks.Infllmv2Impl`), or `IMPLS` for several variants. Adding a backend is one such file; a file whose
import fails (toolchain missing) is reported as skipped with the reason, never silently dropped.
A file that sets `HEAVY = True` has its checks marked heavy (run by `make test-all`, not by CI).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_IMPLS_DIR = Path(__file__).parent / "impls"


def _discover() -> list:
    params = []
    for path in sorted(_IMPLS_DIR.glob("*.py")):
        if path.name.startswith("_"):
            continue
        spec = importlib.util.spec_from_file_location(f"infllmv2_impl_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ImportError as e:
            params.append(pytest.param(None, id=path.stem,
                                       marks=pytest.mark.skip(reason=f"{path.name}: {e}")))
            continue
        impls = getattr(module, "IMPLS", None) or [getattr(module, "IMPL", None)]
        if impls[0] is None:
            raise RuntimeError(f"{path} defines no IMPL (an infllmv2_checks.Infllmv2Impl)")
        # HEAVY = True: the implementation's checks run in `make test-all` / `-m heavy` only
        marks = [pytest.mark.heavy] if getattr(module, "HEAVY", False) else []
        params.extend(pytest.param(impl, id=impl.name, marks=marks) for impl in impls)
    return params


IMPLS = _discover()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "impl" in metafunc.fixturenames:
        metafunc.parametrize("impl", IMPLS)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs on one intra-op thread (tests/conftest.py)."""
