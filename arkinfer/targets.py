"""Device target profiles: `targets/<id>.toml` read into frozen, validated `Target` objects.

Profiles are data (schema: targets/README.md). Every roofline number is a `Quantity` with its
provenance; a `derived` number carries its arithmetic as an expression ("9600e6 * 64 / 8") that the
loader evaluates and compares with the value, so a derivation cannot drift from its number.
Every problem in a file raises one `TargetError` naming the file, the table, the bad value and
what is allowed.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import operator
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

from arkinfer.errors import TargetError

SCHEMA_VERSION = 1
PROFILES_PACKAGE = "arkinfer.target_profiles"
_SCHEMA_HINT = "the profile schema is written down in targets/README.md"


class Provenance(StrEnum):
    """Where a number comes from."""

    VENDOR = "vendor"  # datasheet or vendor page
    DERIVED = "derived"  # arithmetic from other numbers; `derivation` holds the expression
    MEASURED = "measured"  # a measurement; `measurement` names it
    ASSUMED = "assumed"  # an engineering default with no datum yet; `source` says why


class DType(StrEnum):
    """Unquantised tensor dtypes a device computes in (safetensors names, lower case)."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    F8_E4M3 = "f8_e4m3"  # FP8 tensor cores: sm_89 and later
    F8_E5M2 = "f8_e5m2"
    I8 = "i8"


# The vocabulary the shipped profiles use; quant format names are those of the
# `arkinfer.quant.formats` registry (tests keep both in step). User profiles may name other
# backends or formats (third-party backends register through entry points), so the loader checks
# only their spelling.
KNOWN_BACKENDS = ("tensorrt", "mlx", "tvm", "gguf", "coreml", "reference")
KNOWN_QUANT_FORMATS = ("marlin", "gptq", "awq", "onnx-qdq", "ort", "mlx",
                       "gguf-q4_0", "gguf-q4_1", "gguf-q8_0", "gguf-tq1_0", "gguf-tq2_0")
COMPUTE_KEYS = {
    "fp32": "FP32 FLOP/s (CUDA cores / SIMD)",
    "fp16": "dense FP16 FLOP/s (tensor cores where present)",
    "fp16_acc32": "dense FP16 FLOP/s with FP32 accumulate (where lower, e.g. GeForce)",
    "fp8": "dense FP8 FLOP/s",
    "int8": "dense INT8 OP/s",
    "int8_sparse": "2:4-sparse INT8 OP/s of the GPU",
    "total_int8_sparse": "vendor headline AI OP/s of the whole module (sparse GPU + DLAs)",
    "npu_int8": "INT8 OP/s of the neural engine / NPU",
}
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_IDENT = re.compile(r"^[a-z][a-z0-9_]*$")
_SPELLING = {_NAME: "lower-case letters, digits, '.', '_' or '-'",
             _IDENT: "a lower-case identifier: letters, digits and '_'"}
_DERIVATION_RTOL = 5e-3


@dataclass(frozen=True)
class Quantity:
    """A number with its provenance. Units follow the key: bytes, bytes/s, FLOP/s, OP/s, ratio."""

    value: float
    provenance: Provenance
    source: str
    derivation: str | None = None  # arithmetic expression, required for `derived`
    measurement: str | None = None  # what was measured and how, required for `measured`

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "provenance": str(self.provenance)}
        if self.derivation:
            out["derivation"] = self.derivation
        if self.measurement:
            out["measurement"] = self.measurement
        out["source"] = self.source
        return out


@dataclass(frozen=True)
class BackendSupport:
    """One backend a target accepts: the quant formats and dtypes it may use there."""

    name: str
    quant_formats: tuple[str, ...]
    dtypes: tuple[DType, ...]
    note: str | None = None


@dataclass(frozen=True)
class Codegen:
    """Code-generation facts and limits (architecture constants; `source` cites them)."""

    source: str | None = None
    cpu: str | None = None
    cpu_cores: int | None = None
    cpu_features: tuple[str, ...] = ()
    llvm_triple: str | None = None
    gpu_api: str | None = None  # cuda | metal | opencl
    cuda_arch: str | None = None
    cuda_gencode: tuple[str, ...] = ()  # nvcc -gencode values: cubins and PTX to ship
    sm_count: int | None = None
    max_threads_per_block: int | None = None
    max_shared_memory_per_block: int | None = None  # bytes, static
    max_shared_memory_per_block_optin: int | None = None  # bytes, dynamic opt-in
    registers_per_block: int | None = None
    thread_warp_size: int | None = None
    metal_gpu_family: str | None = None
    tvm_target: str | None = None
    tvm_host: str | None = None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(self).items() if v not in (None, ())}


_CODEGEN_TYPES: dict[str, type] = {f.name: str for f in dataclasses.fields(Codegen)}
_CODEGEN_TYPES.update({k: int for k in ("cpu_cores", "sm_count", "max_threads_per_block",
                                        "max_shared_memory_per_block", "registers_per_block",
                                        "max_shared_memory_per_block_optin", "thread_warp_size")})
_CODEGEN_TYPES.update({k: list for k in ("cpu_features", "cuda_gencode", "notes")})


@dataclass(frozen=True)
class Target:
    """A device profile. `memory`, `bandwidth` and `compute` are empty on `measured_at_runtime`
    profiles (host) until `with_measured` fills them in."""

    id: str
    name: str
    vendor: str
    aliases: tuple[str, ...]
    default_backend: str
    backends: Mapping[str, BackendSupport] = field(hash=False)
    dtypes: tuple[DType, ...]
    memory: Quantity | None  # bytes
    memory_kind: str | None
    unified_memory: bool | None
    bandwidth: Quantity | None  # peak bytes/s
    sustained_bandwidth: Quantity | None  # bytes/s, where measured
    compute: Mapping[str, Quantity] = field(hash=False)  # keys from COMPUTE_KEYS
    roofline: str | None  # the `compute` key the latency model divides FLOPs by
    eta_bw: Quantity | None  # achieved / peak bandwidth in decode
    eta_c: Quantity | None  # achieved / peak compute in prefill
    codegen: Codegen
    notes: tuple[str, ...] = ()
    measured_at_runtime: bool = False
    path: str = ""

    @property
    def quant_formats(self) -> tuple[str, ...]:
        """Every quant format some backend accepts on this target, first-seen order."""
        return tuple(dict.fromkeys(q for b in self.backends.values() for q in b.quant_formats))

    @property
    def peak_compute(self) -> Quantity | None:
        return self.compute.get(self.roofline) if self.roofline else None

    def backend(self, name: str | None = None) -> BackendSupport:
        """The backend `name` (default: the target's default); TargetError if not allowed."""
        name = name or self.default_backend
        if name not in self.backends:
            raise TargetError(
                f"backend '{name}' is not allowed on target '{self.id}'; allowed: "
                f"{', '.join(self.backends)}",
                hint=f"use --backend {self.default_backend} (the default for {self.id})")
        return self.backends[name]

    def check(self, backend: str | None = None, quant_format: str | None = None,
              dtype: str | None = None) -> BackendSupport:
        """Raise TargetError unless `backend` takes `quant_format` and `dtype` on this target."""
        b = self.backend(backend)
        for kind, value, allowed in (("quant format", quant_format, b.quant_formats),
                                     ("dtype", dtype, tuple(str(d) for d in b.dtypes))):
            if value is None or value in allowed:
                continue
            others = [o.name for o in self.backends.values() if value in
                      (o.quant_formats if kind == "quant format" else [str(d) for d in o.dtypes])]
            hint = (f"backend {', '.join(others)} takes it on {self.id}: pass --backend {others[0]}"
                    if others else f"pick one of: {', '.join(allowed) or 'none'}")
            raise TargetError(f"{kind} '{value}' is not allowed for backend '{b.name}' on target "
                              f"'{self.id}'; allowed: {', '.join(allowed) or 'none'}", hint=hint)
        return b

    def with_measured(self, measurement: str, *, memory_bytes: float | None = None,
                      bandwidth: float | None = None, compute: Mapping[str, float] | None = None,
                      roofline: str | None = None) -> Target:
        """A copy with runtime measurements filled in (how `arkinfer doctor` completes `host`)."""
        def q(v: float) -> Quantity:
            return Quantity(float(v), Provenance.MEASURED, "measured on this machine",
                            measurement=measurement)
        new_compute = dict(self.compute) | {k: q(v) for k, v in (compute or {}).items()}
        return dataclasses.replace(
            self, memory=q(memory_bytes) if memory_bytes is not None else self.memory,
            bandwidth=q(bandwidth) if bandwidth is not None else self.bandwidth,
            compute=new_compute, roofline=roofline or self.roofline)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: every number with its provenance."""
        def opt(q: Quantity | None) -> dict[str, Any] | None:
            return q.to_dict() if q else None
        return {
            "id": self.id, "name": self.name, "vendor": self.vendor, "aliases": list(self.aliases),
            "default_backend": self.default_backend,
            "backends": {n: {"quant_formats": list(b.quant_formats),
                             "dtypes": [str(d) for d in b.dtypes], "note": b.note}
                         for n, b in self.backends.items()},
            "dtypes": [str(d) for d in self.dtypes], "quant_formats": list(self.quant_formats),
            "memory": {"kind": self.memory_kind, "unified": self.unified_memory,
                       "total": opt(self.memory)},
            "bandwidth": {"peak": opt(self.bandwidth), "sustained": opt(self.sustained_bandwidth)},
            "compute": {"roofline": self.roofline,
                        **{k: v.to_dict() for k, v in self.compute.items()}},
            "efficiency": {"bandwidth": opt(self.eta_bw), "compute": opt(self.eta_c)},
            "codegen": self.codegen.to_dict(), "notes": list(self.notes),
            "measured_at_runtime": self.measured_at_runtime, "path": self.path,
        }


# ---------------------------------------------------------------------------------------------
# Parsing and validation


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

    def dtypes(self, table: str, data: dict, key: str) -> tuple[DType, ...]:
        out = []
        for v in self.typed(table, data, key, list, ()):
            if v not in DType._value2member_map_:
                raise self.fail(table, f"{key} entry {v!r} is not a dtype; allowed: "
                                f"{', '.join(d.value for d in DType)}")
            out.append(DType(v))
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
        "efficiency", "codegen"}
_DEVICE = {"id", "name", "vendor", "aliases", "default_backend", "notes", "measured_at_runtime"}
# (table, key) of the quantities outside [compute]; the first four are required on fixed devices.
_QUANTITIES = (("memory", "total"), ("bandwidth", "peak"), ("efficiency", "bandwidth"),
               ("efficiency", "compute"), ("bandwidth", "sustained"))


def _backends(f: _File, doc: dict, dtypes: tuple[DType, ...]) -> dict[str, BackendSupport]:
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
        measured_at_runtime=runtime, path=path)


def _read(text: str, where: str, path: str) -> Target:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TargetError(f"{where}: not valid TOML: {exc}", hint=_SCHEMA_HINT) from None
    return _parse(doc, where, path)


def load_target_file(path: str | Path) -> Target:
    """Load and validate a profile from a file of your own (same schema as the shipped ones)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TargetError(f"cannot read target profile '{p}': {exc.strerror or exc}",
                          hint="check the path, or run `arkinfer targets` for the built-in ids")
    return _read(text, str(p), str(p.resolve()))


def index_targets(targets: list[Target]) -> dict[str, str]:
    """Map every id and alias to its id; TargetError when two profiles claim one name."""
    names: dict[str, str] = {}
    by_id = {t.id: t for t in targets}
    for t in targets:
        for name in (t.id, *t.aliases):
            if name in names:
                owner = by_id[names[name]]
                raise TargetError(
                    f"{t.path or t.id}: name '{name}' is already taken by target '{owner.id}' "
                    f"({owner.path or owner.id})", hint="give every id and alias to one profile")
            names[name] = t.id
    return names


@functools.lru_cache(maxsize=1)
def _registry() -> tuple[dict[str, Target], dict[str, str]]:
    targets = []
    for entry in resources.files(PROFILES_PACKAGE).iterdir():
        if not entry.name.endswith(".toml"):
            continue
        where = f"targets/{entry.name}"
        t = _read(entry.read_text(encoding="utf-8"), where, where)
        if t.id != entry.name.removesuffix(".toml"):
            raise TargetError(f"{where}: id = '{t.id}' does not match the file name",
                              hint=f"rename the file to {t.id}.toml or fix the id")
        targets.append(t)
    targets.sort(key=lambda t: t.id)
    return {t.id: t for t in targets}, index_targets(targets)


def list_targets() -> list[Target]:
    """Every shipped profile, sorted by id (each one validated)."""
    return list(_registry()[0].values())


def _known() -> str:
    return ", ".join(f"{t.id} ({', '.join(t.aliases)})" if t.aliases else t.id
                     for t in list_targets())


def resolve_id(name: str) -> str:
    """The id a target name or alias stands for; TargetError listing the known ones otherwise."""
    names = _registry()[1]
    key = name.strip().lower()
    if key in names:
        return names[key]
    close = difflib.get_close_matches(key, list(names), n=1, cutoff=0.6)
    hint = (f"did you mean '{close[0]}'? " if close else "") + \
        "`arkinfer targets` lists them; a path to your own .toml profile also works"
    raise TargetError(f"unknown target '{name}'; known: {_known()}", hint=hint)


def load_target(id_or_alias: str) -> Target:
    """A shipped profile by id or alias, or a user profile by path (`*.toml`)."""
    if id_or_alias.endswith(".toml") or "/" in id_or_alias or "\\" in id_or_alias:
        return load_target_file(id_or_alias)
    return _registry()[0][resolve_id(id_or_alias)]
