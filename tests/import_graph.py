"""The project's import graph, read from source with `ast` (imported by test_import_cycles.py as
`import_graph`; pytest puts tests/ on sys.path).

    graph, edges = import_graph()       # {module: {modules it imports}}, {module: [(Import, to)]}
    cycles(graph)                        # strongly connected components of 2+ modules
    cycle_path(graph, component)         # one closed path through a component, for messages

Every module of the installed layout is read: the folders of setup.py's ROOTS (`backends/`
imports as `arkinfer.backends`, `quant/` as `arkinfer.quant`). Imports inside function bodies
count (a cycle behind a function-level import is a cycle all the same, only a later one);
imports under `if TYPE_CHECKING:` never run and are left out. Relative imports are resolved.

An edge goes to the deepest project module an import names: `from arkinfer.ir import graph` is
an edge to `arkinfer.ir.graph`, `from arkinfer.ir import trace` one to `arkinfer.ir` (its
`__init__`). The parent packages a dotted import runs first are not edges: a package
`__init__` re-exporting its own submodules would otherwise make every package a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BACKENDS = "arkinfer.backends"


@dataclass(frozen=True)
class Import:
    """One imported name: `module` (absolute, dotted), `name` (None for `import module`)."""

    module: str
    name: str | None
    line: int


def package_roots(repo: Path = REPO) -> dict[str, Path]:
    """setup.py's ROOTS ({package: folder}), read from its source (running it would build)."""
    tree = ast.parse((repo / "setup.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] \
                == ["ROOTS"]:
            return {name: repo / folder for name, folder in ast.literal_eval(node.value).items()}
    raise AssertionError(f"{repo / 'setup.py'} defines no ROOTS = {{package: folder}} table")


def module_files(roots: dict[str, Path] | None = None) -> dict[str, Path]:
    """Every module's dotted name -> its file (a package's name -> its `__init__.py`)."""
    modules = {}
    for package, folder in (roots or package_roots()).items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node below `tree` except what `if TYPE_CHECKING:` guards (its else branch runs)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                yield child
                yield from _runtime_nodes(child)
            continue
        yield node
        yield from _runtime_nodes(node)


def imports_of(name: str, path: Path) -> list[Import]:
    """The imports of module `name` (file `path`), function bodies included, relative ones
    resolved against its package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [Import(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = parts[:len(parts) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found += [Import(base, a.name, node.lineno) for a in node.names]
    return found


def target_of(imp: Import, modules: dict[str, Path]) -> str | None:
    """The project module an import runs: the submodule it names if one exists, else its base;
    None outside the project."""
    if imp.name is not None and f"{imp.module}.{imp.name}" in modules:
        return f"{imp.module}.{imp.name}"
    return imp.module if imp.module in modules else None


def import_graph(modules: dict[str, Path] | None = None
                 ) -> tuple[dict[str, set[str]], dict[str, list[tuple[Import, str]]]]:
    """({module: project modules it imports}, {module: [(import, target module)]})."""
    modules = modules or module_files()
    graph, edges = {}, {}
    for name, path in modules.items():
        edges[name] = [(imp, t) for imp in imports_of(name, path)
                       if (t := target_of(imp, modules)) is not None and t != name]
        graph[name] = {t for _, t in edges[name]}
    return graph, edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def cycle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One closed path through `component` (breadth first from its first module)."""
    members, start = set(component), component[0]
    paths, frontier = {start: [start]}, [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    following.append(w)
        frontier = following
    return component


def backend_of(module: str) -> str | None:
    """"gguf" for arkinfer.backends.gguf.lower; None outside a backend's folder."""
    parts = module.split(".")
    return parts[2] if module.startswith(BACKENDS + ".") and len(parts) > 2 else None


def private_use(importer: str, imp: Import, modules: dict[str, Path]) -> str | None:
    """The private (`_name`) part of `imp` that `importer` reaches from outside its owner, or
    None. A private module is shared by the modules of its package; any other private name
    belongs to its module alone."""
    parts = imp.module.split(".") + ([imp.name] if imp.name else [])
    for i, part in enumerate(parts):
        if not part.startswith("_") or part.startswith("__"):
            continue
        owner, dotted = ".".join(parts[:i]), ".".join(parts[:i + 1])
        if not (dotted in modules and importer.startswith(owner + ".")):
            return dotted
    return None
