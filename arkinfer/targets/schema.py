"""Parse and validate one target profile TOML document into a `Target` (schema:
targets/README.md). Every problem raises one `TargetError` naming the file, the table, the bad
value and what is allowed; `derived` numbers are re-computed from their arithmetic."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import operator
import re
import tomllib
from typing import Any

from arkinfer.errors import TargetError
from arkinfer.targets.model import (
    COMPUTE_KEYS,
    SCHEMA_VERSION,
    BackendSupport,
    Codegen,
    DeviceDType,
    MatrixSpec,
    Provenance,
    Quantity,
    Target,
)

# Validation facts of the profile schema (targets/README.md).
_SCHEMA_HINT = "the profile schema is written down in targets/README.md"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_IDENT = re.compile(r"^[a-z][a-z0-9_]*$")
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a GitHub Actions runner label
_SPELLING = {_NAME: "lower-case letters, digits, '.', '_' or '-'",
             _IDENT: "a lower-case identifier: letters, digits and '_'",
             _LABEL: "a runner label: letters, digits, '.', '_' or '-'"}
_DERIVATION_RTOL = 5e-3
_CODEGEN_TYPES: dict[str, type] = {f.name: str for f in dataclasses.fields(Codegen)}
_CODEGEN_TYPES.update({k: int for k in ("cpu_cores", "sm_count", "max_threads_per_block",
                                        "max_shared_memory_per_block", "registers_per_block",
                                        "max_shared_memory_per_block_optin", "thread_warp_size")})
_CODEGEN_TYPES.update({k: list for k in ("cpu_features", "cuda_gencode", "notes")})


def evaluate_derivation(expr: str) -> float:
    """Evaluate an arithmetic expression of numbers and + - * / ** (nothing else)."""
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.Pow: operator.pow}

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -ev(node.operand) if isinstance(node.op, ast.USub) else ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent above 64")
            return ops[type(node.op)](left, right)
        raise ValueError(f"'{ast.unparse(node)}' is not a number or + - * / **")

    try:
        return float(ev(ast.parse(expr.strip(), mode="eval").body))
    except (SyntaxError, ZeroDivisionError, OverflowError) as exc:
        raise ValueError(str(exc)) from None


class _File:
    """Validation helpers bound to one file name, so every error says where it is."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, table: str, message: str, hint: str | None = None) -> TargetError:
        # No square brackets in messages: the CLI prints them through rich, which reads
        # "[bandwidth.peak]" as a markup tag and drops it.
        loc = f"table '{table}': " if table else ""
        return TargetError(f"{self.where}: {loc}{message}", hint=hint or _SCHEMA_HINT)

    def keys(self, table: str, data: Any, allowed: set[str], required: set[str] = frozenset()):
        if not isinstance(data, dict):
            raise self.fail(table, f"must be a table, got {type(data).__name__} {data!r}")
        for key in data:
            if key not in allowed:
                close = difflib.get_close_matches(key, sorted(allowed), n=1)
                raise self.fail(table, f"unknown key '{key}'; allowed: "
                                f"{', '.join(sorted(allowed))}",
                                hint=f"did you mean '{close[0]}'?" if close else None)
        for key in sorted(required):
            if key not in data:
                raise self.fail(table, f"missing key '{key}'")
        return data

    def typed(self, table: str, data: dict, key: str, kind: type, default: Any = None) -> Any:
        """data[key] checked to be of `kind` (float takes ints; list means list of strings)."""
        if key not in data:
            return default
        value = data[key]
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind is list:
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        else:
            ok = isinstance(value, kind)
        if not ok:
            want = {list: "a list of strings", float: "a number", bool: "true or false"}.get(
                kind, kind.__name__)
            raise self.fail(table, f"{key} = {value!r} must be {want}")
        return tuple(value) if kind is list else value

    def names(self, table: str, data: dict, key: str, pattern: re.Pattern) -> tuple[str, ...]:
        values = self.typed(table, data, key, list, ())
        for v in values:
            if not pattern.match(v):
                raise self.fail(table, f"{key} entry {v!r} must be {_SPELLING[pattern]}")
        if len(set(values)) != len(values):
            raise self.fail(table, f"{key} = {list(values)} lists an entry twice")
        return values

    def dtypes(self, table: str, data: dict, key: str) -> tuple[DeviceDType, ...]:
        out = []
        for v in self.typed(table, data, key, list, ()):
            if v not in DeviceDType._value2member_map_:
                raise self.fail(table, f"{key} entry {v!r} is not a dtype; allowed: "
                                f"{', '.join(d.value for d in DeviceDType)}")
            out.append(DeviceDType(v))
        return tuple(out)

    def quantity(self, table: str, data: Any, ratio: bool = False) -> Quantity:
        self.keys(table, data, {"value", "provenance", "source", "derivation", "measurement"},
                  {"value", "provenance", "source"})
        value = float(self.typed(table, data, "value", float))
        prov = self.typed(table, data, "provenance", str)
        if prov not in Provenance._value2member_map_:
            raise self.fail(table, f"provenance = {prov!r} is not one of "
                            f"{', '.join(p.value for p in Provenance)}")
        prov = Provenance(prov)
        source = self.typed(table, data, "source", str)
        derivation = self.typed(table, data, "derivation", str)
        measurement = self.typed(table, data, "measurement", str)
        if not source.strip():
            raise self.fail(table, "source is empty; cite the datasheet, page or measurement")
        if not (value > 0 and (value <= 1 or not ratio)):
            raise self.fail(table, f"value = {value!r} must be "
                            + ("in (0, 1]" if ratio else "> 0"))
        if prov is Provenance.DERIVED:
            if not derivation:
                raise self.fail(table, "provenance 'derived' needs derivation = \"<arithmetic>\"",
                                hint='e.g. derivation = "9600e6 * 64 / 8"')
            try:
                result = evaluate_derivation(derivation)
            except ValueError as exc:
                raise self.fail(table, f"derivation {derivation!r} is not arithmetic: {exc}",
                                hint="use numbers and + - * / ** only, e.g. \"9600e6 * 64 / 8\"")
            if abs(result - value) > _DERIVATION_RTOL * abs(value):
                raise self.fail(table, f"derivation {derivation!r} = {result:.6g} but value = "
                                f"{value:.6g}", hint="fix the value or the arithmetic")
        elif derivation:
            raise self.fail(table, f"derivation given but provenance is '{prov}'",
                            hint="set provenance = \"derived\" or drop the derivation")
        if prov is Provenance.MEASURED and not measurement:
            raise self.fail(table, "provenance 'measured' needs measurement = "
                            "\"<what was measured, how, on which device>\"")
        return Quantity(value, prov, source, derivation, measurement)


_TOP = {"schema", "device", "capabilities", "backends", "memory", "bandwidth", "compute",
        "efficiency", "codegen", "matrix"}
_DEVICE = {"id", "name", "vendor", "aliases", "default_backend", "notes", "measured_at_runtime"}
# (table, key) of the quantities outside [compute]; the first four are required on fixed devices.
_QUANTITIES = (("memory", "total"), ("bandwidth", "peak"), ("efficiency", "bandwidth"),
               ("efficiency", "compute"), ("bandwidth", "sustained"))


def _backends(f: _File, doc: dict, dtypes: tuple[DeviceDType, ...]) -> dict[str, BackendSupport]:
    if not isinstance(doc["backends"], dict) or not doc["backends"]:
        raise f.fail("backends", f"must hold one table per backend, got {doc['backends']!r}",
                     hint="add a backends.<name> table with quant_formats = [...]")
    out: dict[str, BackendSupport] = {}
    for name, table in doc["backends"].items():
        where = f"backends.{name}"
        if not _IDENT.match(name):
            raise f.fail(where, f"backend name {name!r} must be {_SPELLING[_IDENT]}")
        f.keys(where, table, {"quant_formats", "dtypes", "note"}, {"quant_formats"})
        b_dtypes = f.dtypes(where, table, "dtypes") if "dtypes" in table else dtypes
        extra = [str(d) for d in b_dtypes if d not in dtypes]
        if extra:
            raise f.fail(where, f"dtypes {extra} are not in capabilities.dtypes "
                         f"{[str(d) for d in dtypes]}", hint="the device cannot compute in them")
        out[name] = BackendSupport(name, f.names(where, table, "quant_formats", _NAME), b_dtypes,
                                   f.typed(where, table, "note", str))
    return out


def _matrix(f: _File, doc: dict) -> MatrixSpec:
    """The optional `[matrix]` table: presets CI builds for this target, and the labels of a
    self-hosted runner that is the device. Preset names are checked for spelling here; a test
    checks the shipped profiles' against the preset registry (user profiles may name others)."""
    if "matrix" not in doc:
        return MatrixSpec()
    table = f.keys("matrix", doc["matrix"], {"presets", "device_labels"}, {"presets"})
    labels = f.names("matrix", table, "device_labels", _LABEL)
    if labels and "self-hosted" not in labels:
        raise f.fail("matrix", f"device_labels = {list(labels)} must include 'self-hosted'",
                     hint="on-device jobs run on your own runner: device_labels = "
                     "[\"self-hosted\", \"<target id>\"]")
    return MatrixSpec(f.names("matrix", table, "presets", _NAME), labels)


def _parse(doc: dict, where: str, path: str = "") -> Target:
    f = _File(where)
    f.keys("", doc, _TOP, {"schema", "device", "capabilities", "backends", "codegen"})
    if doc["schema"] != SCHEMA_VERSION or isinstance(doc["schema"], bool):
        raise f.fail("", f"schema = {doc['schema']!r} is not supported; this ArkInfer reads "
                     f"schema = {SCHEMA_VERSION}")
    dev = f.keys("device", doc["device"], _DEVICE, {"id", "name", "vendor", "default_backend"})
    tid = f.typed("device", dev, "id", str)
    if not _NAME.match(tid):
        raise f.fail("device", f"id = {tid!r} must be {_SPELLING[_NAME]}")
    runtime = f.typed("device", dev, "measured_at_runtime", bool, False)
    caps = f.keys("capabilities", doc["capabilities"], {"dtypes"}, {"dtypes"})
    dtypes = f.dtypes("capabilities", caps, "dtypes")
    backends = _backends(f, doc, dtypes)
    default = f.typed("device", dev, "default_backend", str)
    if default not in backends:
        raise f.fail("device", f"default_backend = {default!r} has no backends.{default} table; "
                     f"backends: {', '.join(backends)}")

    tables = {"memory": {"kind", "unified", "total"}, "bandwidth": {"peak", "sustained"},
              "efficiency": {"bandwidth", "compute"}, "compute": {"roofline", *COMPUTE_KEYS}}
    data = {t: f.keys(t, doc.get(t, {}), allowed) for t, allowed in tables.items()}
    q: dict[str, Quantity] = {}  # "table.key" -> Quantity
    for i, (table, key) in enumerate(_QUANTITIES):
        if key in data[table]:
            q[f"{table}.{key}"] = f.quantity(f"{table}.{key}", data[table][key],
                                             ratio=table == "efficiency")
        elif i < 4 and not runtime:
            raise f.fail(table, f"missing '{key}' (only measured_at_runtime profiles omit it)")
    compute = {k: f.quantity(f"compute.{k}", v) for k, v in data["compute"].items()
               if k != "roofline"}
    roofline = f.typed("compute", data["compute"], "roofline", str)
    if compute and roofline is None:
        raise f.fail("compute", "missing 'roofline'; name the entry the latency model uses: "
                     + ", ".join(compute))
    if roofline is not None and roofline not in compute:
        raise f.fail("compute", f"roofline = {roofline!r} names no entry; entries: "
                     f"{', '.join(compute) or 'none'}")
    peak, sustained = q.get("bandwidth.peak"), q.get("bandwidth.sustained")
    if peak and sustained and sustained.value > peak.value:
        raise f.fail("bandwidth", "sustained bandwidth exceeds peak")
    cg = f.keys("codegen", doc["codegen"], set(_CODEGEN_TYPES), {"source"})
    codegen = Codegen(**{k: f.typed("codegen", cg, k, t) for k, t in _CODEGEN_TYPES.items()
                         if k in cg})
    return Target(
        id=tid, name=f.typed("device", dev, "name", str),
        vendor=f.typed("device", dev, "vendor", str),
        aliases=f.names("device", dev, "aliases", _NAME), default_backend=default,
        backends=backends, dtypes=dtypes, memory=q.get("memory.total"),
        memory_kind=f.typed("memory", data["memory"], "kind", str),
        unified_memory=f.typed("memory", data["memory"], "unified", bool), bandwidth=peak,
        sustained_bandwidth=sustained, compute=compute, roofline=roofline,
        eta_bw=q.get("efficiency.bandwidth"), eta_c=q.get("efficiency.compute"),
        codegen=codegen, notes=f.typed("device", dev, "notes", list, ()),
        measured_at_runtime=runtime, path=path, matrix=_matrix(f, doc))


def parse_profile(text: str, where: str, path: str) -> Target:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TargetError(f"{where}: not valid TOML: {exc}", hint=_SCHEMA_HINT) from None
    return _parse(doc, where, path)
