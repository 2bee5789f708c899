"""TVM's default Relax pipeline run in two halves, and this machine's llvm target: the
compilation steps every TVM build here shares (compile.py's model builds, infllmv2.py's
stand-alone attention module, the tests' kernels), with nothing of the model lowering in them.

    target = host_target()                              # llvm for this CPU and its core count
    scheduled = schedule(mod, target)                   # dispatch, legalise, fuse, dlight
    executable = finish(scheduled, target)              # dataflow lowering, VM lowering, codegen

`relax.get_default_pipeline(target)` is run in two halves (dispatch + legalize + schedule, then
lowering + finalisation) so the scheduled module is exactly what codegen compiles. GPU schedules
are TVM's own dlight defaults; llvm adds cpu_schedule.py's rules.
"""

from __future__ import annotations

import os
from typing import Any

import tvm
from tvm import relax
from tvm.target import Target


def host_target() -> Target:
    """llvm for this machine's CPU (its features enable LLVM's vectoriser) and its core count
    (the parallel loops of cpu_schedule.py)."""
    cpu = tvm.get_global_func("tvm.codegen.llvm.GetHostCPUName", allow_missing=True)
    spec: dict[str, Any] = {"kind": "llvm", "num-cores": os.cpu_count() or 1}
    if cpu is not None:
        spec["mcpu"] = cpu()
    return Target(spec)


def _default_pipeline_module(target: Target):
    """The module whose `get_default_pipeline` `relax.get_default_pipeline(target)` returns (the
    same dispatch; read directly because 0.27's `relax.pipeline.dataflow_lower_passes` fails for
    llvm: cpu_generic's package does not re-export it)."""
    import importlib

    if target.kind.name == "llvm":
        return importlib.import_module("tvm.relax.backend.cpu_generic.pipeline")
    if target.kind.name == "opencl" and "adreno" in target.keys:
        return importlib.import_module("tvm.relax.backend.adreno.pipeline")
    return importlib.import_module("tvm.relax.backend.gpu_generic.pipeline")


def schedule(mod: tvm.IRModule, target: Target, cpu_rules: bool = True) -> tvm.IRModule:
    """First half of `relax.get_default_pipeline(target)`: library dispatch, legalisation, fusion
    and (on GPUs) dlight's default schedules; on llvm, then dlight with cpu_schedule's rules
    (`cpu_rules=False`: the plain loops of the CPU default pipeline). Returns Relax + scheduled
    TIR PrimFuncs."""
    from tvm.s_tir import dlight

    from .cpu_schedule import host_rules

    pipeline = _default_pipeline_module(target)
    with target, tvm.transform.PassContext(opt_level=3):
        passes = pipeline.library_dispatch_passes(target) + pipeline.legalize_passes(target)
        if target.kind.name == "llvm" and cpu_rules:
            passes.append(dlight.ApplyDefaultSchedule(*host_rules()))
        return tvm.transform.Sequential(passes)(mod)


def finish(scheduled: tvm.IRModule, target: Target) -> relax.VMExecutable:
    """Second half of the default pipeline (dataflow lowering, memory planning, VM lowering),
    then TIR lowering and codegen."""
    pipeline = _default_pipeline_module(target)
    rest = tvm.transform.Sequential(pipeline.dataflow_lower_passes(target)
                                    + pipeline.finalize_passes(target))
    return tvm.compile(scheduled, target=target, relax_pipeline=rest)
