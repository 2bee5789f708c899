"""The import structure (issue #39): no import cycles (function-level imports included), no
backend importing another backend's modules, no module importing another module's private
(`_name`) names. The graph is read from source: tests/import_graph.py.

The known exceptions below are each waiting for a change outside the one that added this test;
each names that change. A known exception that no longer occurs fails
`test_every_known_exception_still_occurs`, so the lists only shrink: delete the entry.
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

FORMATS = "arkinfer.quant.formats"

# Import cycles: a cycle found (a strongly connected component) is known when one of these sets
# holds all of its modules.
KNOWN_CYCLES: dict[frozenset[str], str] = {
    frozenset({"arkinfer.backends.coreml.artifact", "arkinfer.backends.coreml.backend"}):
        "artifact.py imports OPTIONS / context_option from backend.py, which imports artifact.py "
        "in lower(): both move to an options.py that backend.py and artifact.py import",
    frozenset({f"arkinfer.backends.mlx.{m}" for m in
               ("artifact", "backend", "model", "runner", "tensors", "weights")}):
        "artifact.py and tensors.py import shard_bytes / OPTIONS from backend.py, which imports "
        "artifact.py and runner.py in its methods: they move to an options.py",
    frozenset({f"arkinfer.backends.tvm.{m}" for m in
               ("artifact", "backend", "reference", "rpc_bench", "runner")}):
        "artifact.py imports OPTIONS from backend.py, which imports artifact.py in its methods: "
        "OPTIONS moves to an options.py",
    frozenset({FORMATS, "arkinfer.quant.rtn", *(f"{FORMATS}.{m}" for m in (
        "awq", "ggml_native", "gguf", "gguf_blocks", "gptq", "marlin", "mlx", "onnx_qdq", "ort",
        "ternary"))}):
        "quant/formats/__init__.py imports every format to register it and each format imports "
        "`register` / `get_format` back from the package (gguf_blocks <-> ggml_native too, and "
        "rtn's get_format): the registry moves to a module of its own (quant/, outside this "
        "change)",
}
# (importer, imported backend module) pairs.
KNOWN_CROSS_BACKEND: dict[tuple[str, str], str] = {
    ("arkinfer.backends.tensorrt.backend", "arkinfer.backends.onnx.backend"):
        "TensorRTBackend subclasses OnnxBackend (tests/test_seams.py asserts it)",
    ("arkinfer.backends.tensorrt.preflight", "arkinfer.backends.onnx.preflight"):
        "check_lowerable: the ONNX lowering's preflight moves to arkinfer/lowering/ with the "
        "capabilities change",
}
# (importer, private dotted name) pairs.
KNOWN_PRIVATE: dict[tuple[str, str], str] = {
    ("arkinfer.frontend.gguf_model", "arkinfer.models._config"):
        "the config helpers gguf_model reads become public in arkinfer/models/",
    ("arkinfer.backends.gguf.llamacpp_quantize", "arkinfer.backends.gguf.runner._llama_cpp"):
        "runner.py's llama_cpp loader becomes public",
    ("arkinfer.backends.gguf.parallel", "arkinfer.backends.gguf.runner._llama_cpp"):
        "runner.py's llama_cpp loader becomes public",
    ("arkinfer.quant.calib.sequential", "arkinfer.quant.calib.block._Stop"):
        "quant/calib (outside this change)",
    ("arkinfer.quant.formats.gguf", "arkinfer.quant.formats.mlx._check_bias_recovers_zero"):
        "quant/formats (outside this change)",
}


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
