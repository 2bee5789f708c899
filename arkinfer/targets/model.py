"""Device target profiles as typed, frozen objects: `Target`, `Quantity` (a number with its
provenance), `BackendSupport`, `Codegen`. Parsing and validation live in `schema.py`, loading
in `__init__.py`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from arkinfer.errors import TargetError

__all__ = ["COMPUTE_KEYS", "KNOWN_BACKENDS", "SCHEMA_VERSION", "BackendSupport", "Codegen",
           "DeviceDType", "MatrixSpec", "Provenance", "Quantity", "Target"]

SCHEMA_VERSION = 1
PROFILES_PACKAGE = "arkinfer.target_profiles"


class Provenance(StrEnum):
    """Where a number comes from."""

    VENDOR = "vendor"  # datasheet or vendor page
    DERIVED = "derived"  # arithmetic from other numbers; `derivation` holds the expression
    MEASURED = "measured"  # a measurement; `measurement` names it
    ASSUMED = "assumed"  # an engineering default with no datum yet; `source` says why


class DeviceDType(StrEnum):
    """Unquantised tensor dtypes a device computes in (safetensors names, lower case)."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    F8_E4M3 = "f8_e4m3"  # FP8 tensor cores: sm_89 and later
    F8_E5M2 = "f8_e5m2"
    I8 = "i8"


# The backends the shipped profiles name (third-party backends register through entry points, so
# the loader checks only the spelling of user profiles' names). Quant format names are not listed
# here: they are the `arkinfer.quant.formats` registry's (`known_quant_formats()`).
KNOWN_BACKENDS = ("tensorrt", "onnx", "mlx", "tvm", "gguf", "coreml", "reference")
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
    dtypes: tuple[DeviceDType, ...]
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




@dataclass(frozen=True)
class MatrixSpec:
    """What CI ships for a target (the profile's `[matrix]` table), read by `arkinfer matrix` and
    .github/workflows/artifacts.yml alike.

    presets: `--quant` values built for this target, one artifact each (empty = none).
    device_labels: `runs-on` labels of a self-hosted runner that is this device; when set (and
        the repository enables device jobs) the workflow re-verifies and benches each artifact
        there. Empty = no on-device job.
    """

    presets: tuple[str, ...] = ()
    device_labels: tuple[str, ...] = ()


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
    dtypes: tuple[DeviceDType, ...]
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
    matrix: MatrixSpec = MatrixSpec()

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
            "matrix": {"presets": list(self.matrix.presets),
                       "device_labels": list(self.matrix.device_labels)},
        }


# ---------------------------------------------------------------------------------------------
# Parsing and validation
