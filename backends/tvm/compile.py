"""Two compilations of one Relax module: the host build (llvm, this machine: the Runner's verify,
eval and bench) and the device builds (OpenCL with an aarch64 Android host: Adreno, Mali).

    b = build(program, params)                  # params: weights.program_params(...)[0]
    b.host_exec                                 # relax VMExecutable for tvm.cpu()
    b.device_exec["adreno"]                     # VMExecutable: OpenCL kernels + aarch64 host code
    b.device_mod_scheduled["adreno"]            # IRModule after the GPU default pipeline's
                                                #   legalize + dlight schedules, before codegen
    b.opencl_source("adreno")                   # the generated OpenCL C (one `// Function:` each)

GPU schedules are TVM's own: `relax.get_default_pipeline(target)` applies dlight's default
rules (Adreno: Reduction, GeneralReduction, Fallback; other OpenCL devices: gpu_generic's Matmul,
GEMV, Reduction, GeneralReduction, Fallback); nothing here binds a loop by hand. The pipeline
is run in two halves (default_pipeline.py: dispatch + legalize + schedule, then lowering +
finalisation) so the scheduled module is exactly what codegen compiles. The host build uses
the CPU default pipeline plus dlight with cpu_schedule.py's rules (rfactored, vectorised,
parallel linears; dlight's CPU Reduction rule; parallel outer loops), for this CPU and its core
count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.target import Target

from arkinfer.errors import ArkError

from .default_pipeline import finish, host_target, schedule
from .lower_relax import HostDecode, Signature, lower_program

ANDROID_HOST: dict[str, Any] = {"kind": "llvm", "mtriple": "aarch64-linux-android"}
# OpenCL GPUs of Android phones; the key is the artifact's device/<variant>.tar name.
DEVICE_VARIANTS: dict[str, dict[str, Any]] = {
    "adreno": {"kind": "opencl", "device": "adreno"},
    "mali": {"kind": "opencl", "device": "mali"},
}


def parse_target(text: str) -> dict[str, Any]:
    """A target dict from the legacy string form the profiles carry ("opencl -device=adreno",
    "llvm -mtriple=aarch64-linux-android"): TVM 0.27 accepts dicts and tags, not those."""
    kind, *opts = text.split()
    out: dict[str, Any] = {"kind": kind}
    for opt in opts:
        m = re.fullmatch(r"-{1,2}([\w-]+)=(\S+)", opt)
        if m is None:
            raise ArkError(f"target option {opt!r} of {text!r} is not -key=value",
                           hint="write TVM targets as 'kind -key=value ...' in the profile")
        out[m.group(1)] = m.group(2)
    return out


def device_target(variant: str, host: dict[str, Any] | None = None) -> Target:
    if variant not in DEVICE_VARIANTS:
        raise ArkError(f"unknown tvm device variant {variant!r}; known: {sorted(DEVICE_VARIANTS)}",
                       hint="pass --option devices=adreno,mali (a subset)")
    return Target(DEVICE_VARIANTS[variant], host=host or ANDROID_HOST)


@dataclass
class Build:
    """Everything one compilation produced (see the module doc)."""

    signature: Signature
    params: dict[str, np.ndarray]
    host_exec: relax.VMExecutable | None = None
    host_target: Target | None = None
    device_exec: dict[str, relax.VMExecutable] = field(default_factory=dict)
    device_mod_scheduled: dict[str, tvm.IRModule] = field(default_factory=dict)
    device_targets: dict[str, Target] = field(default_factory=dict)

    def opencl_source(self, variant: str) -> str:
        """The OpenCL C of a device build (the executable's imported device module)."""
        return opencl_source(self.device_exec[variant])


def opencl_source(executable: relax.VMExecutable) -> str:
    """OpenCL C of every kernel of a device executable ('' when it has none)."""
    todo, out = list(executable.mod.imports), []
    while todo:
        m = todo.pop(0)
        if m.kind == "opencl":
            out.append(m.inspect_source("cl"))
        todo.extend(m.imports)
    return "\n".join(out)


def build(program: Any, params: dict[str, np.ndarray], *, host: bool = True,
          devices: tuple[str, ...] = ("adreno", "mali"),
          device_host: dict[str, Any] | None = None, decode_activations: str = "int16") -> Build:
    """Lower `program`, compile it for this machine and for each device variant.
    The host module is lowered on its own (HostDecode: decode's 4-bit linears as hand-built
    GEMVs taking `decode_activations` "int16" / "int8" (kernels_qact.py) or "f32"
    (kernels_gemv.py)); the device builds compile the portable module (fp32 TE linears, dlight),
    lowered only when a device variant is asked for. Both modules have the same signature."""
    host_exec = target = sig = None
    if host:
        target = host_target()
        host_mod, sig = lower_program(program, params, HostDecode(target, decode_activations))
        host_exec = finish(schedule(host_mod, target), target)
    if devices or sig is None:
        portable, sig = lower_program(program, params)
    out = Build(sig, params, host_exec, target)
    for variant in devices:
        device = device_target(variant, device_host)
        scheduled = schedule(portable, device)
        out.device_targets[variant] = device
        out.device_mod_scheduled[variant] = scheduled
        out.device_exec[variant] = finish(scheduled, device)
    return out
