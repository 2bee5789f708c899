"""Symbolic dimensions: an int, or an integer expression over named dims such as "T", "P+T", "S+1".

Expressions are parsed with `ast` (never `eval` of raw text: a program folder is untrusted input),
kept canonical through sympy (so "T+P" and "P+T" compare equal and print the same) and evaluated
against bound sizes by the interpreter. Only `+`, `-`, `*`, integers and names are allowed: that is
all the dynamic shapes of a decoder LLM need (sequence length, cache length and their sums).
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Mapping
from typing import Union

import sympy

from arkinfer.ir.errors import IRVerifyError

Dim = Union[int, str]  # noqa: UP007 - a type alias used at runtime by isinstance checks elsewhere

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BINOPS = {ast.Add: sympy.Add, ast.Sub: lambda a, b: a - b, ast.Mult: sympy.Mul}


def _to_sympy(node: ast.AST, text: str) -> sympy.Expr:
    if isinstance(node, ast.Expression):
        return _to_sympy(node.body, text)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return sympy.Integer(node.value)
    if isinstance(node, ast.Name):
        return sympy.Symbol(node.id, integer=True)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_to_sympy(node.operand, text)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_to_sympy(node.left, text), _to_sympy(node.right, text))
    raise IRVerifyError(f"dimension expression {text!r} uses {type(node).__name__}, which is not allowed",
                      hint="dims are ints or expressions of names with + - * and integers, e.g. 'P+T'")


@functools.lru_cache(maxsize=4096)
def parse(text: str) -> sympy.Expr:
    """The sympy form of a dim expression ("P+T" -> P + T)."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise IRVerifyError(f"dimension expression {text!r} is not valid",
                          hint="write e.g. 'T', 'P+T' or 'S+1'") from None
    return sympy.expand(_to_sympy(tree, text))


def from_sympy(expr: sympy.Expr) -> Dim:
    """Canonical Dim of a sympy expression: an int when constant, else text without spaces."""
    expr = sympy.expand(expr)
    if expr.is_Integer:
        return int(expr)
    return str(expr).replace(" ", "")


def canon(d: Dim | sympy.Expr) -> Dim:
    """Canonical form: ints stay ints; expressions print in one way ("T+P" -> "P+T")."""
    if isinstance(d, bool):
        raise IRVerifyError(f"dimension {d!r} is a bool, not an int or expression")
    if isinstance(d, int):
        return d
    if isinstance(d, str):
        return from_sympy(parse(d))
    return from_sympy(d)


def as_sympy(d: Dim) -> sympy.Expr:
    return sympy.Integer(d) if isinstance(d, int) else parse(d)


def equal(a: Dim, b: Dim) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return sympy.expand(as_sympy(a) - as_sympy(b)) == 0


def add(*ds: Dim) -> Dim:
    if all(isinstance(d, int) for d in ds):
        return sum(ds)  # type: ignore[arg-type]
    return from_sympy(sympy.Add(*[as_sympy(d) for d in ds]))


def product(ds: tuple[Dim, ...] | list[Dim]) -> sympy.Expr:
    return sympy.expand(sympy.Mul(*[as_sympy(d) for d in ds])) if ds else sympy.Integer(1)


def symbols(d: Dim) -> set[str]:
    return set() if isinstance(d, int) else {s.name for s in parse(d).free_symbols}


@functools.lru_cache(maxsize=4096)
def _compiled(text: str):
    parse(text)  # validates: only names, ints, + - *
    return compile(ast.parse(text, mode="eval"), "<dim>", "eval")


def evaluate(d: Dim, env: Mapping[str, int]) -> int:
    """The size `d` takes when the named dims have the sizes in `env`."""
    if isinstance(d, int):
        return d
    missing = symbols(d) - set(env)
    if missing:
        raise IRVerifyError(f"dimension {d!r} uses {sorted(missing)}, which are not bound",
                          hint="bind every named dim from the entry point's inputs")
    return int(eval(_compiled(d), {"__builtins__": {}}, dict(env)))


def is_name(text: str) -> bool:
    return bool(_NAME.match(text))
