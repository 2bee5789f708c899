"""Render a model's chat template with bounded output, memory and time.

A chat template is code from a model folder. jinja2's `ImmutableSandboxedEnvironment` already
keeps it away from Python internals (no attribute escapes, no mutation of lists and dicts) but
not from the machine: `{{ 'A' * 400000000 }}`, `tojson(indent=100000000)` or two nested
`range(100000)` loops allocate GBs or never finish. `render` adds the missing bounds:

- sizes: no value a template builds may exceed MAX_CHARS characters (estimated before it is
  built: repetition `*`, `+`, `~`, `%`, str.join/replace/format, the join/replace/indent/
  wordwrap/format/tojson filters, block and macro bodies, and every `{{ }}` output), no
  integer argument of a call or filter exceeds MAX_INT_ARG, integers stay below MAX_INT_BITS
  bits, `tojson` indents by at most MAX_INDENT;
- output: the rendered text is at most MAX_CHARS characters (the prompt, not the template),
  and all `{{ }}` output produced while rendering, discarded blocks included, MAX_PRODUCED;
- work: at most MAX_STEPS loop iterations + calls + operators, and RENDER_SECONDS of wall time.

Every limit is a `TokenizerError` naming the limit. Rendering is otherwise what transformers'
`apply_chat_template` does (same environment options and helpers), so prompts stay identical.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from jinja2 import nodes, pass_context
from jinja2.nodes import EvalContext
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

from arkinfer.errors import TokenizerError

MAX_CHARS = 4_000_000  # longest string / rendered prompt: ~1M tokens, beyond any context here
MAX_TEMPLATE_CHARS = 1_000_000  # the template source itself (real ones are < 20 K)
MAX_INT_BITS = 4096
MAX_INT_ARG = 1_000_000  # widths, counts and sizes passed to calls and filters
MAX_INDENT = 32
MAX_STEPS = 2_000_000
MAX_PRODUCED = 10 * MAX_CHARS  # all `{{ }}` output, kept or not (macros, `{% set %}` blocks)
RENDER_SECONDS = 5.0
MAX_DEPTH = 100  # nesting of lists/dicts a template may print
_PERCENT_WIDTH = re.compile(r"%[-+ #0-9.]*(\*|\d{7,})")  # "%1000000d", "%*d"
_BRACE_WIDTH = re.compile(r"\{[^{}]*?\d{7,}")  # "{:>1000000}"


def _limit(what: str) -> TokenizerError:
    return TokenizerError(f"the chat template exceeded a rendering limit: {what}",
                          hint="the model's chat template is hostile or broken; fix "
                          "tokenizer_config.json's chat_template, or pass --raw to skip it")


def text_size(value: Any, budget: int = MAX_CHARS, depth: int = 0) -> int:
    """Upper-bound estimate of len(str(value)) (or its JSON), without building it.

    Stops counting once past `budget` (the result is then > budget), so shared references
    (`[s, s]` nested 40 times) cost at most `budget` steps, never 2^40."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, bool) or value is None:
        return 5
    if isinstance(value, int):
        return value.bit_length() // 3 + 2
    if isinstance(value, (float, complex, datetime)):
        return 32
    if depth > MAX_DEPTH:
        raise _limit(f"values nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, Namespace):
        value = value._Namespace__attrs  # type: ignore[attr-defined]
    if isinstance(value, Mapping):
        items: Iterable[Any] = (x for kv in value.items() for x in kv)
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = value
    else:
        return 64  # other objects print as a short repr
    total = 2
    for item in items:
        total += 2 + text_size(item, budget - total, depth + 1)
        if total > budget:
            break
    return total


def _check_size(size: int, what: str) -> None:
    if size > MAX_CHARS:
        raise _limit(f"{what} would be over {MAX_CHARS:,} characters")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with size, step and time limits; one instance per render."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, finalize=self._finalize,
                         extensions=["jinja2.ext.loopcontrols"])
        self.steps, self.produced, self.deadline = 0, 0, time.monotonic() + RENDER_SECONDS
        for name, fn in list(self.filters.items()):
            self.filters[name] = self._guarded(fn, f"filter '{name}'")
        self.filters["tojson"] = self._guarded(_tojson, "filter 'tojson'")
        self.filters["ark_loop"], self.filters["ark_concat"] = _loop, _concat
        self.globals["raise_exception"] = _raise_exception
        self.globals.pop("lipsum", None)  # lipsum(n=10**6) writes GBs; no chat template uses it
        self.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)

    def tick(self) -> None:
        """Count one step of work; raise past MAX_STEPS or RENDER_SECONDS."""
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise _limit(f"more than {MAX_STEPS:,} loop iterations and calls")
        if self.steps % 256 == 0 and time.monotonic() > self.deadline:
            raise _limit(f"rendering took longer than {RENDER_SECONDS:g} s")

    # -- hooks the sandbox calls ---------------------------------------------------------------
    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        __self._check_args(args, kwargs, "a call")
        name, owner = getattr(__obj, "__name__", ""), getattr(__obj, "__self__", None)
        owner = getattr(getattr(__obj, "__wrapped__", None), "__self__", owner)  # str.format
        if isinstance(owner, str):
            _check_size(_str_method_size(owner, name, args, kwargs), f"str.{name}()")
        result = super().call(__context, __obj, *args, **kwargs)
        _check_size(text_size(result), "a call's result")
        return result

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        self.tick()
        if operator == "*":
            seq, count = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(count, int):
                _check_size(text_size(seq) * max(count, 0), f"repetition x {count}")
            elif isinstance(left, int) and isinstance(right, int):
                _check_bits(left.bit_length() + right.bit_length())
        elif operator == "**" and isinstance(left, int) and isinstance(right, int):
            _check_bits(left.bit_length() * max(right, 0) if abs(left) > 1 else 1)
        elif operator == "+":
            _check_size(text_size(left) + text_size(right), "a sum")
        elif operator == "%" and isinstance(left, str):
            _check_format(left, right)
        return super().call_binop(context, operator, left, right)

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.tick()
        return super().getitem(obj, argument)

    def concat(self, parts: Iterable[str]) -> str:  # type: ignore[override]
        """Joins the output of macro, `{% set %}` and filter-block bodies: size checked first."""
        parts = list(parts)
        _check_size(sum(len(p) for p in parts), "a block or macro's output")
        return "".join(parts)

    def _finalize(self, value: Any) -> Any:
        size = text_size(value)
        _check_size(size, "an output value")
        self.produced += size
        if self.produced > MAX_PRODUCED:
            raise _limit(f"the template produced more than {MAX_PRODUCED:,} characters of output")
        return value

    # -- helpers -------------------------------------------------------------------------------
    def _check_args(self, args: tuple[Any, ...], kwargs: dict[str, Any], what: str,
                    first_is_value: bool = False) -> None:
        """Every argument's size; integer arguments (a filter's input value aside) <= MAX_INT_ARG."""
        self.tick()
        for i, value in enumerate((*args, *kwargs.values())):
            if (isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT_ARG
                    and not (first_is_value and i == 0)):
                raise _limit(f"{what} got the integer argument {value}; allowed up to "
                             f"{MAX_INT_ARG:,}")
            _check_size(text_size(value), f"an argument of {what}")

    def _guarded(self, fn: Any, what: str) -> Any:
        """`fn` (a filter) with its arguments and result checked, jinja's pass_* flag kept."""
        def guarded(*args: Any, **kwargs: Any) -> Any:
            plain = [a for a in args if not isinstance(a, (Context, EvalContext, BoundedEnvironment))]
            self._check_args(tuple(plain), kwargs, what, first_is_value=True)
            _check_size(_filter_size(what, plain, kwargs), f"the result of {what}")
            result = fn(*args, **kwargs)
            _check_size(text_size(result), f"the result of {what}")
            return result

        guarded.__dict__.update(getattr(fn, "__dict__", {}))  # jinja_pass_arg
        return guarded

    def render(self, source: str, **variables: Any) -> str:
        """Compile (loops and `~` rewritten to counted forms) and render within the limits."""
        if len(source) > MAX_TEMPLATE_CHARS:
            raise _limit(f"the template is {len(source):,} characters, over "
                         f"{MAX_TEMPLATE_CHARS:,}")
        template = self.from_string(_Bounded().visit(self.parse(source)))
        parts, size = [], 0
        for part in template.generate(**variables):
            size += len(part)
            _check_size(size, "the rendered prompt")
            parts.append(part)
        return "".join(parts)


def _check_bits(bits: int) -> None:
    if bits > MAX_INT_BITS:
        raise _limit(f"an integer of about {bits:,} bits, over {MAX_INT_BITS:,}")


def _check_format(fmt: str, args: Any, pattern: re.Pattern[str] = _PERCENT_WIDTH) -> None:
    if pattern.search(fmt):
        raise _limit(f"a format width of 1,000,000 or more (or '*') in {fmt[:40]!r}")
    _check_size(len(fmt) + text_size(args), "a formatted string")


def _str_method_size(s: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Size of `s.name(*args)` for the str methods that can multiply their input."""
    if name == "join" and args:
        return _join_size(s, args[0])
    if name == "replace" and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
        return _replace_size(s, args[0], args[1])
    if name in ("format", "format_map"):
        _check_format(s, args, _BRACE_WIDTH)
        return len(s) + text_size(args) + text_size(kwargs)
    if name == "expandtabs":
        return len(s) * (int(args[0]) if args and isinstance(args[0], int) else 8)
    return len(s)


def _join_size(sep: str, items: Any) -> int:
    if not isinstance(items, (list, tuple, str)):
        return len(sep)  # a generator: each item is checked as it is produced
    return text_size(list(items)) + len(sep) * len(items)


def _replace_size(s: str, old: str, new: str) -> int:
    count = s.count(old) if old else len(s) + 1
    return len(s) + count * max(len(new) - len(old), 0)


def _filter_size(what: str, args: list[Any], kwargs: dict[str, Any]) -> int:
    """Size of a filter's result where it can exceed its input's (join, replace, indent, ...)."""
    name = what.split("'")[1]
    value = args[0] if args else None
    if not isinstance(value, str) and name not in ("join", "format"):
        return 0
    if name == "join":
        sep = args[1] if len(args) > 1 else kwargs.get("d", "")
        return _join_size(str(sep), value)
    if name == "replace" and len(args) >= 3:
        return _replace_size(value, str(args[1]), str(args[2]))
    if name == "format":
        _check_format(str(value), args[1:])
        return 0
    if name in ("indent", "wordwrap"):
        width = args[1] if len(args) > 1 else kwargs.get("width", 4 if name == "indent" else 79)
        extra = len(width) if isinstance(width, str) else 1 if name == "wordwrap" else int(width)
        lines = value.count("\n") + 1 if name == "indent" else len(value) // max(int(
            width) if isinstance(width, int) else 1, 1) + 1
        wrap = kwargs.get("wrapstring") or (args[3] if name == "wordwrap" and len(args) > 3 else "")
        return len(value) + lines * (extra + len(str(wrap or "")) + 1)
    return 0


def _tojson(value: Any, indent: Any = None, **_: Any) -> str:
    """transformers' `tojson` (ensure_ascii off), with `indent` at most MAX_INDENT."""
    if indent is not None and (not isinstance(indent, int) or not 0 <= indent <= MAX_INDENT):
        raise _limit(f"tojson(indent={indent!r}); allowed 0..{MAX_INDENT}")
    _check_size(text_size(value) * (1 + (indent or 0)), "tojson's output")
    return json.dumps(value, ensure_ascii=False, indent=indent)


@pass_context
def _loop(context: Context, iterable: Any) -> Iterator[Any]:
    """A for-loop's iterable, counted one step per iteration."""
    env = context.environment
    for item in iterable:
        env.tick()  # type: ignore[attr-defined]
        yield item


@pass_context
def _concat(context: Context, items: list[Any]) -> str:
    """The `~` operator: str of each item joined, size checked first."""
    context.environment.tick()  # type: ignore[attr-defined]
    _check_size(sum(text_size(x) for x in items), "a '~' concatenation")
    return "".join(map(str, items))


def _raise_exception(message: str) -> None:
    raise TokenizerError(f"chat template error: {message}",
                         hint="the model's chat template refused these messages")


class _Bounded(NodeTransformer):
    """Rewrite `for x in E` to `for x in E|ark_loop` and `a ~ b` to `[a, b]|ark_concat`."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        node = self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, "ark_loop", [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        node = self.generic_visit(node)
        items = nodes.List(node.nodes, lineno=node.lineno)
        return nodes.Filter(items, "ark_concat", [], [], None, None, lineno=node.lineno)
