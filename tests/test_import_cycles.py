"""The import structure (issue #39): no import cycles (function-level imports included), no
backend importing another backend's modules, no module importing another module's private
(`_name`) names. The graph is read from source: tests/import_graph.py.

The lists of known exceptions below are empty; an entry (with the change that will remove it)
is a last resort. A known exception that no longer occurs fails
`test_every_known_exception_still_occurs`, so the lists only shrink.
"""

from __future__ import annotations

import functools
from pathlib import Path

from import_graph import (
    backend_of,
    cycle_path,
    cycles,
    import_graph,
    imports_of,
    module_files,
    private_use,
)

# Import cycles: a cycle found (a strongly connected component) is known when one of these sets
# holds all of its modules.
KNOWN_CYCLES: dict[frozenset[str], str] = {}
# (importer, imported backend module) pairs.
KNOWN_CROSS_BACKEND: dict[tuple[str, str], str] = {}
# (importer, private dotted name) pairs.
KNOWN_PRIVATE: dict[tuple[str, str], str] = {}


@functools.cache
def project() -> tuple[dict[str, Path], dict[str, set[str]], dict]:
    """(modules, graph, edges) of the whole project, read once per test run."""
    modules = module_files()
    return (modules, *import_graph(modules))


def found_cycles() -> tuple[dict[str, set[str]], list[list[str]]]:
    _, graph, _ = project()
    return graph, cycles(graph)


def cross_backend_imports() -> dict[tuple[str, str], int]:
    _, _, edges = project()
    return {(name, target): imp.line for name, found in edges.items() if (own := backend_of(name))
            for imp, target in found if backend_of(target) not in (None, own)}


def private_imports() -> dict[tuple[str, str], int]:
    modules, _, edges = project()
    return {(name, private): imp.line for name, found in edges.items() for imp, _ in found
            if (private := private_use(name, imp, modules)) is not None}


def test_the_walk_resolves_relative_and_function_level_imports(tmp_path: Path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "if TYPE_CHECKING:\n"
        "    from .c import Never\n"
        "def f():\n"
        "    from .sub.d import g\n"
        "    from ..outside import h\n", encoding="utf-8")
    found = {(i.module, i.name) for i in imports_of("root.pkg.a", pkg / "a.py")}
    assert found == {("typing", "TYPE_CHECKING"), ("root.pkg", "b"), ("root.pkg.sub.d", "g"),
                     ("root.outside", "h")}


def test_the_walk_covers_every_root_of_setup_py():
    _, graph, _ = project()
    assert {"arkinfer.cli.main", "arkinfer.backends.gguf.backend", "arkinfer.quant.export",
            "arkinfer.lowering.source_weights"} <= set(graph)
    # a function-level import is an edge: checkpoint.load_model imports quant.load in its body
    assert "arkinfer.quant.load" in graph["arkinfer.frontend.checkpoint"]


def test_no_import_cycles():
    graph, found = found_cycles()
    new = [c for c in found if not any(known >= set(c) for known in KNOWN_CYCLES)]
    assert not new, "import cycles (break each by moving the shared piece down a layer):\n" + \
        "\n".join(" -> ".join(cycle_path(graph, c)) for c in new)


def test_no_backend_imports_another_backend():
    new = [f"{a}:{line} imports {b}" for (a, b), line in cross_backend_imports().items()
           if (a, b) not in KNOWN_CROSS_BACKEND]
    assert not new, "a backend imports another backend's module (move what they share to " \
        "arkinfer/lowering/ or a public core module):\n" + "\n".join(new)


def test_no_module_imports_a_private_name_from_another_module():
    new = [f"{a}:{line} imports {b}" for (a, b), line in private_imports().items()
           if (a, b) not in KNOWN_PRIVATE]
    assert not new, "private names used outside their owner (make them public and " \
        "documented, or move them):\n" + "\n".join(new)


def test_every_known_exception_still_occurs():
    _, found = found_cycles()
    stale = [" / ".join(sorted(known)) for known in KNOWN_CYCLES
             if not any(known >= set(c) for c in found)]
    stale += [f"{a} -> {b}" for a, b in KNOWN_CROSS_BACKEND if (a, b) not in
              cross_backend_imports()]
    stale += [f"{a} -> {b}" for a, b in KNOWN_PRIVATE if (a, b) not in private_imports()]
    assert not stale, "fixed: delete these known exceptions from tests/test_import_cycles.py:\n" \
        + "\n".join(stale)
