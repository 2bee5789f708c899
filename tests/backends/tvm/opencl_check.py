"""Run the OpenCL kernels of a TVM device build on a real OpenCL runtime (PoCL on this CPU).

A test harness (test_tvm_opencl_pocl.py imports it as `opencl_check`; pytest puts this folder on
sys.path), not part of the tvm backend: no artifact or Runner uses it.

The pip build of TVM has no OpenCL runtime, so nothing in TVM itself can launch the kernels it
writes for Adreno / Mali. This module launches them through pyopencl on any OpenCL platform
(Debian's PoCL here, a phone's driver just as well) and compares every result with the same
PrimFunc built for llvm:

    plans = launch_plans(scheduled_mod, target)          # PrimFunc name -> FuncPlan
    cl = OpenCLDevice()                                  # first platform's first device (PoCL)
    checks = check_kernels(scheduled_mod, device_exec, target, dims={"n": 7})   # random inputs
    out, checks = run_on_opencl(scheduled_mod, device_exec, target, "decode", args)  # one step

Where each piece comes from:
- source: the executable's imported OpenCL module, `inspect_source("cl")`; one `// Function: K`
  section per kernel K (forward declarations + definition), each built as its own program.
- argument order and launch grid: the scheduled PrimFunc lowered by TVM's own TIR pipeline up to
  `SplitHostDevice` (the exact module codegen starts from). Its host part holds one
  `call_ffi_kernel(K, args..., extents...)` per launch: buffer arguments (kernel arguments are
  ordered handles first, then by name), host-side scalars such as shape variables or a
  common-subexpression `cse_v1 = n * 32`, and one extent per `launch_params` tag
  (blockIdx.x/y/z, threadIdx.x/y/z). We evaluate those expressions for the actual shapes, so
  global size = blockIdx * threadIdx and local size = threadIdx per axis, as TVM's runtime does.
- reference: the scheduled PrimFunc with its thread bindings turned back into serial loops, built
  for llvm (a TensorIR schedule never changes what a function computes, so the serial reading is
  the function's meaning); a whole step compares with the caller's llvm build of the module.

Precision. fp32 kernels must match within max|a - b| / max|b| <= 1e-5 (`FP32_TOL`). PoCL has no
`cl_khr_fp16`: kernels that touch `half` are run with `half` rewritten to `float` (inputs widened
exactly), which checks their indexing and their fp32 arithmetic but not half-precision rounding
on a device; their tolerance is `FP16_TOL` = 1e-3 and their `KernelCheck.precision` says
"fp16 run as fp32". Real fp16 numerics need a device with cl_khr_fp16 (a phone).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.tirx.buffer import BufferType

from arkinfer.errors import NotAvailableError

FP32_TOL = 1e-5
FP16_TOL = 1e-3
INSTALL_HINT = ("apt-get install -y pocl-opencl-icd ocl-icd-opencl-dev clinfo && "
                "pip install pyopencl")
_CL_SCALARS = {"char": np.int8, "uchar": np.uint8, "short": np.int16, "ushort": np.uint16,
               "int": np.int32, "uint": np.uint32, "long": np.int64, "ulong": np.uint64,
               "float": np.float32, "double": np.float64}
_AXES = ("x", "y", "z")


def opencl_unavailable() -> str | None:
    """Why no OpenCL device can run kernels here (None when one can)."""
    try:
        import pyopencl as cl
    except ImportError:
        return "pyopencl is not installed"
    try:
        devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    except cl.Error as e:  # no ICD loader / no platform
        return f"no OpenCL platform ({e})"
    return None if devices else "the OpenCL platforms list no device"


# ---- where the kernels and their launches come from -------------------------------------


def opencl_sections(device_exec: Any) -> dict[str, str]:
    """Kernel name -> its `// Function:` section of the OpenCL source inside `device_exec` (a
    `tvm.compile` result or a runtime module with an imported opencl module)."""
    root = getattr(device_exec, "mod", device_exec)
    stack, sources = [root], []
    while stack:
        m = stack.pop()
        if m.kind == "opencl":
            sources.append(m.inspect_source("cl"))
        stack.extend(m.imports)
    if not sources:
        raise NotAvailableError("the executable has no OpenCL module",
                                hint="build it for an opencl target, e.g. Target({'kind': "
                                "'opencl', 'device': 'adreno'}, host={'kind': 'llvm'})")
    sections = {}
    for source in sources:
        for part in re.split(r"^// Function: ", source, flags=re.M)[1:]:
            name, _, body = part.partition("\n")
            sections[name.strip()] = body
    return sections


@dataclass(frozen=True)
class Launch:
    """One kernel launch: `args` are host-side TIR expressions (a buffer argument is the index of
    the PrimFunc parameter it points to, an int), `extents` go with `tags` (blockIdx.x, ...)."""

    kernel: str
    args: tuple[Any, ...]
    extents: tuple[Any, ...]
    tags: tuple[str, ...]


@dataclass(frozen=True)
class FuncPlan:
    """A device PrimFunc: its launches in order, the parameters it writes, its host wrapper."""

    name: str
    func: tirx.PrimFunc
    host: tirx.PrimFunc
    launches: tuple[Launch, ...]
    written: tuple[int, ...]


def launch_plans(scheduled_mod: tvm.IRModule, target: tvm.target.Target) -> dict[str, FuncPlan]:
    """Every device PrimFunc of `scheduled_mod` (GPU default pipeline applied) -> its FuncPlan."""
    device = {gv.name_hint: f for gv, f in scheduled_mod.functions.items()
              if isinstance(f, tirx.PrimFunc) and _is_device(f)}
    if not device:
        return {}
    captured: dict[str, tvm.IRModule] = {}

    @tvm.instrument.pass_instrument
    class _AfterSplit:
        def run_after_pass(self, mod, info):
            if info.name.endswith("SplitHostDevice"):
                captured["mod"] = mod

    # before the Relax finalize passes a PrimFunc may have no global_symbol yet (codegen names
    # it after its GlobalVar then, as we do)
    mod = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in device.items()})
    mod = tirx.transform.BindTarget(target.with_host(target.host or "llvm"))(mod)
    pipeline, _, _ = tirx.get_tir_pipeline("default")  # what tvm.compile runs
    with tvm.transform.PassContext(instruments=[_AfterSplit()]), target:
        pipeline(mod)
    plans = {}
    for name, func in device.items():
        host = captured["mod"][name]  # the wrapper; its kernels are `name`_kernel...
        plans[name] = FuncPlan(name, func, host, tuple(_launches(host)), _written(func))
    return plans


def _is_device(func: tirx.PrimFunc) -> bool:
    """Kernels carry the device target, or none (then the build binds the device target);
    host helpers such as the VM's `shape_func` say `tirx.is_host_func` or carry llvm."""
    attrs = func.attrs or {}
    if attrs.get("tirx.is_host_func"):
        return False
    target = attrs.get("target")
    return target is None or target.kind.name not in ("llvm", "c")


def _written(func: tirx.PrimFunc) -> tuple[int, ...]:
    stores: list[Any] = []
    tvm_ffi.structural_walk(func.body, (tirx.BufferStore, stores.append), order="pre")
    return tuple(i for i, p in enumerate(func.params)
                 if any(s.buffer.same_as(p) for s in stores))


def _launches(host: tirx.PrimFunc) -> list[Launch]:
    """The kernel launches of a host wrapper after SplitHostDevice, in program order."""
    alias = {}  # DeclBuffer var -> parameter index
    out: list[Launch] = []

    def param_of(expr) -> int:
        base = expr.args[0] if isinstance(expr, tvm.ir.expr.Call) else expr
        for i, p in enumerate(host.params):
            if base.same_as(p):
                return i
        for var, i in alias.items():
            if base.same_as(var):
                return i
        raise NotAvailableError(f"kernel argument {expr} of {host} is not a parameter's data",
                                hint="opencl_check reads buffer arguments only")

    def visit(stmt) -> None:
        kind = type(stmt).__name__
        if kind == "SeqStmt":
            for s in stmt.seq:
                visit(s)
        elif kind == "DeclBuffer":
            alias[stmt.buffer] = param_of(stmt.data)
        elif kind == "Evaluate" and getattr(stmt.value, "op", None) is not None \
                and stmt.value.op.name == "tirx.call_ffi_kernel":
            call = stmt.value
            tags = tuple(t for t in call.attrs.launch_params if t.startswith(("blockIdx",
                                                                              "threadIdx")))
            if len(tags) != len(call.attrs.launch_params):
                raise NotAvailableError(f"{call.args[0].value}: launch parameters "
                                        f"{list(call.attrs.launch_params)} (dynamic shared "
                                        "memory) are not supported by opencl_check")
            rest = list(call.args[1:])
            kargs, extents = rest[:len(rest) - len(tags)], rest[len(rest) - len(tags):]
            args = tuple(param_of(a) if _is_data(a) else a for a in kargs)
            out.append(Launch(call.args[0].value, args, tuple(extents), tags))
        elif kind in ("Bind", "AssertStmt", "Evaluate"):
            pass  # Bind values are evaluated lazily from the host body (_scalars)
        elif hasattr(stmt, "body"):
            visit(stmt.body)
        else:
            raise NotAvailableError(f"host statement {kind} around the kernel launches of "
                                    f"{host.attrs['global_symbol'] if host.attrs else host}",
                                    hint="opencl_check handles straight-line host wrappers")

    visit(host.body)
    return out


def _is_data(expr) -> bool:
    return isinstance(expr, tvm.ir.expr.Call) and expr.op.name == "tirx.buffer_data"


def _is_buffer(param) -> bool:
    return isinstance(param.ty, BufferType)


def _scalars(host: tirx.PrimFunc, args: Sequence[np.ndarray | int]):
    """An evaluator of host expressions for these arguments (binds every scalar parameter and
    every symbolic dim of the buffer parameters, then every `Bind` of the host body in order)."""
    from tvm.sym import Analyzer

    analyzer, bound = Analyzer(), {}

    def value(expr) -> int | float:
        if isinstance(expr, (int, float)):
            return expr
        simple = analyzer.simplify(expr)
        if not hasattr(simple, "value"):
            raise NotAvailableError(f"cannot evaluate {expr} (left {simple}) for arguments "
                                    f"{[getattr(a, 'shape', a) for a in args]}",
                                    hint="pass arrays for every parameter of the PrimFunc")
        return simple.value

    for p, arg in zip(host.params, args):
        if not _is_buffer(p):
            analyzer.bind(p, tvm.tirx.const(int(arg), str(p.ty)))
            continue
        for dim, actual in zip(p.ty.shape, arg.shape):
            if isinstance(dim, tvm.ir.expr.Var) and not any(dim.same_as(v) for v in bound):
                analyzer.bind(dim, tvm.tirx.const(int(actual), str(dim.ty)))
                bound[dim] = int(actual)

    def bind(stmt) -> None:
        analyzer.bind(stmt.var, tvm.tirx.const(value(stmt.value), str(stmt.var.ty)))

    tvm_ffi.structural_walk(host.body, (tirx.Bind, bind), order="pre")
    return value


# ---- running them -------------------------------------------------------------------------


def _definition(section: str, kernel: str) -> re.Match:
    match = re.search(rf"__kernel void {re.escape(kernel)}\(([^)]*)\)\s*\{{", section)
    if match is None:
        raise NotAvailableError(f"no definition of kernel {kernel} in its OpenCL section",
                                hint="pass the executable built from the same scheduled module")
    return match


def _signature(section: str, kernel: str) -> list[str]:
    """The kernel's argument types in order: "*" for a pointer, else the scalar type ("long")."""
    types = []
    for arg in _definition(section, kernel).group(1).split(","):
        words = arg.replace("*", " * ").split()
        types.append("*" if "*" in words else [w for w in words if w != "const"][0])
    return types


def _uses_half(section: str, kernel: str) -> bool:
    """Whether the kernel itself (its definition, not the shared fp16 prelude) touches half."""
    return re.search(r"\bhalf", section[_definition(section, kernel).start():]) is not None


def _widen_half(source: str) -> str:
    """`half` -> `float` for a device without cl_khr_fp16 (see the module docstring)."""
    # TVM guards fp16 with `#ifdef cl_khr_fp16 ... #error "Half precision ..." #endif`
    source = re.sub(r"#ifdef cl_khr_fp16\n.*?#endif\n", "", source, flags=re.S)
    source = re.sub(r"#pragma OPENCL EXTENSION cl_khr_fp16\s*:\s*enable\n?", "", source)
    source = re.sub(r"\bconvert_half(\d*)", r"convert_float\1", source)
    return re.sub(r"\bhalf(\d*)\b", r"float\1", source)


class OpenCLDevice:
    """The first device of the first OpenCL platform (PoCL's CPU device on this machine)."""

    def __init__(self) -> None:
        reason = opencl_unavailable()
        if reason:
            raise NotAvailableError(f"cannot run OpenCL kernels: {reason}", hint=INSTALL_HINT)
        import pyopencl as cl

        self._cl = cl
        self.device = [d for p in cl.get_platforms() for d in p.get_devices()][0]
        self.name = self.device.name
        self.has_fp16 = "cl_khr_fp16" in self.device.extensions
        self.context = cl.Context([self.device])
        self.queue = cl.CommandQueue(self.context)
        self._kernels: dict[tuple[str, str], Any] = {}

    def _kernel(self, name: str, source: str):
        key = (name, source)
        if key not in self._kernels:
            program = self._cl.Program(self.context, source).build()
            self._kernels[key] = getattr(program, name)
        return self._kernels[key]

    def run(self, plan: FuncPlan, sections: dict[str, str],
            args: Sequence[np.ndarray | int]) -> tuple[dict[int, np.ndarray], bool]:
        """Launch every kernel of `plan` on `args` (one per PrimFunc parameter: an array for a
        buffer, not modified, or an int); -> (parameter index -> its new contents, whether
        `half` was run as `float`)."""
        cl = self._cl
        value = _scalars(plan.host, args)
        arrays = {i: a for i, a in enumerate(args) if isinstance(a, np.ndarray)}
        widened = not self.has_fp16 and (
            any(a.dtype == np.float16 for a in arrays.values())
            or any(_uses_half(sections[k.kernel], k.kernel) for k in plan.launches
                   if k.kernel in sections))
        host = {i: a.astype(np.float32) if widened and a.dtype == np.float16 else
                np.ascontiguousarray(a) for i, a in arrays.items()}
        flags = cl.mem_flags
        buffers = {i: cl.Buffer(self.context, flags.READ_WRITE | flags.COPY_HOST_PTR, hostbuf=a)
                   if a.nbytes else cl.Buffer(self.context, flags.READ_WRITE, 4)
                   for i, a in host.items()}
        for launch in plan.launches:
            source = sections.get(launch.kernel)
            if source is None:
                raise NotAvailableError(f"kernel {launch.kernel} of {plan.name} is not in the "
                                        f"executable's OpenCL source ({len(sections)} kernels)",
                                        hint="pass the executable built from the same module")
            types = _signature(source, launch.kernel)
            if len(types) != len(launch.args):
                raise NotAvailableError(f"{launch.kernel}: the OpenCL signature has "
                                        f"{len(types)} arguments, the launch {len(launch.args)}")
            # the fp16 prelude is in every section of a module that uses fp16 anywhere
            kernel = self._kernel(launch.kernel,
                                  source if self.has_fp16 else _widen_half(source))
            args = [buffers[a] if t == "*" else _CL_SCALARS[t](value(a))
                    for a, t in zip(launch.args, types)]
            size = dict(zip(launch.tags, (int(value(e)) for e in launch.extents)))
            local = tuple(size.get(f"threadIdx.{a}", 1) for a in _AXES)
            grid = tuple(size.get(f"blockIdx.{a}", 1) * n for a, n in zip(_AXES, local))
            if min(grid) == 0:
                continue  # an empty launch (a zero-length dimension): TVM skips it too
            kernel(self.queue, grid, local, *args)
        out = {}
        for i in plan.written:
            data = np.empty_like(host[i])
            if data.nbytes:
                cl.enqueue_copy(self.queue, data, buffers[i])
            out[i] = data.astype(arrays[i].dtype)
        self.queue.finish()
        return out, widened


# ---- the llvm reference and the comparison -------------------------------------------------


def _serial(func: tirx.PrimFunc, name: str) -> tirx.PrimFunc:
    """`func` with every thread binding read as a serial loop (what the schedule means)."""
    def unbind(loop):
        if loop.kind != tirx.ForKind.THREAD_BINDING:
            return loop
        return tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body,
                        None, loop.annotations)

    body = tvm_ffi.structural_map(func.body, (tirx.For, unbind))
    return func.with_body(body).without_attr("target").with_attr("global_symbol", name)


class LLVMReference:
    """The PrimFuncs of `plans` built for llvm (serial reading of their schedules) in one module,
    on first use; `run` takes numpy arrays / ints and returns the written parameters."""

    def __init__(self, plans: dict[str, FuncPlan]) -> None:
        self.plans, self._lib = plans, None

    def run(self, plan: FuncPlan, args: Sequence[np.ndarray | int]) -> dict[int, np.ndarray]:
        if self._lib is None:  # one LLVM codegen for all: ~10x faster than one per function
            mod = tvm.IRModule({n: _serial(p.func, n) for n, p in self.plans.items()})
            self._lib = tvm.tirx.build(mod, target="llvm")
        tensors = [tvm.runtime.tensor(np.array(a)) if isinstance(a, np.ndarray) else a
                   for a in args]
        self._lib[plan.name](*tensors)
        return {i: tensors[i].numpy() for i in plan.written}


@dataclass(frozen=True)
class KernelCheck:
    """One PrimFunc run on OpenCL against llvm: max|a - b| / max|b| over its outputs."""

    name: str
    kernels: tuple[str, ...]
    precision: str          # "fp32" or "fp16 run as fp32" (no cl_khr_fp16 on the device)
    max_rel_diff: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_rel_diff <= self.tolerance


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max|a - b| / max|b| over the finite entries of b (0 for two empty arrays); the non-finite
    entries (InfLLM v2's -inf log-sum-exp of a query that sees no kernel, NaN) must be the same
    values at the same places, else inf. Integers must match exactly."""
    if a.shape != b.shape:
        return float("inf")
    if not a.size:
        return 0.0
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    finite = np.isfinite(b64)
    if not np.array_equal(np.isfinite(a64), finite) or \
            not np.array_equal(a64[~finite], b64[~finite], equal_nan=True):
        return float("inf")
    if not finite.any():
        return 0.0
    return float(np.abs(a64[finite] - b64[finite]).max() / max(np.abs(b64[finite]).max(), 1e-30))


def compare(plan: FuncPlan, got: dict[int, np.ndarray], want: dict[int, np.ndarray],
            widened: bool) -> KernelCheck:
    diff = max((rel_diff(got[i], want[i]) for i in plan.written), default=0.0)
    return KernelCheck(plan.name, tuple(dict.fromkeys(k.kernel for k in plan.launches)),
                       "fp16 run as fp32" if widened else "fp32", diff,
                       FP16_TOL if widened else FP32_TOL)


def random_inputs(func: tirx.PrimFunc, dims: dict[str, int],
                  rng: np.random.Generator) -> list[np.ndarray | int]:
    """One argument per parameter: floats uniform in [-1, 1), uint32 (packed codes) over their
    whole range, other integers in [0, 4) (small enough to be valid indices); a scalar parameter
    and every symbolic dimension take their value from `dims` by name."""
    from tvm.sym import Analyzer

    name = func.attrs.get("global_symbol", "PrimFunc") if func.attrs else "PrimFunc"

    def lookup(var) -> int:
        if var.name not in dims:
            raise NotAvailableError(f"{name}: no value for the symbolic dimension {var.name!r}",
                                    hint=f"pass dims={{'{var.name}': 8}}")
        return dims[var.name]

    out: list[np.ndarray | int] = []
    for p in func.params:
        if not _is_buffer(p):
            out.append(lookup(p))
            continue
        analyzer, shape = Analyzer(), []
        for dim in p.ty.shape:
            free: list[Any] = []
            tvm_ffi.structural_walk(dim, (tvm.ir.expr.Var, free.append), order="pre")
            for var in free:
                analyzer.bind(var, tvm.tirx.const(lookup(var), str(var.ty)))
            shape.append(int(analyzer.simplify(dim).value))
        dtype = np.dtype(str(p.ty.dtype))
        if dtype.kind == "f":
            out.append(rng.uniform(-1, 1, shape).astype(dtype))
        elif dtype == np.uint32:
            out.append(rng.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32))
        else:
            out.append(rng.integers(0, 4, shape).astype(dtype))
    return out


def check_kernels(scheduled_mod: tvm.IRModule, device_exec: Any, target: tvm.target.Target,
                  dims: dict[str, int] | None = None, seed: int = 0,
                  device: OpenCLDevice | None = None) -> list[KernelCheck]:
    """Every device PrimFunc on random inputs: OpenCL (`device`, default PoCL) vs llvm."""
    device = device or OpenCLDevice()
    sections, plans = opencl_sections(device_exec), launch_plans(scheduled_mod, target)
    reference, rng, checks = LLVMReference(plans), np.random.default_rng(seed), []
    for name, plan in sorted(plans.items()):
        arrays = random_inputs(plan.func, dims or {}, rng)
        got, widened = device.run(plan, sections, arrays)
        checks.append(compare(plan, got, reference.run(plan, arrays), widened))
    return checks


# ---- one whole step -------------------------------------------------------------------------


def run_on_opencl(scheduled_mod: tvm.IRModule, device_exec: Any, target: tvm.target.Target,
                  entry: str, args: Sequence[Any], *, check: bool = True,
                  device: OpenCLDevice | None = None) -> tuple[Any, list[KernelCheck]]:
    """Run Relax function `entry` of `scheduled_mod` with every device kernel on OpenCL.

    How: each call of a device PrimFunc in the (already VM-lowered) Relax functions becomes a
    call of a packed function that copies its tensors to the OpenCL device, launches the
    PrimFunc's kernels and copies the written ones back; the rest (memory planning, shape
    arithmetic, host helpers) is TVM's own Relax VM, built for llvm. `args` are numpy arrays or
    tvm tensors in `entry`'s order. With `check`, every call also runs the llvm build of that
    PrimFunc on the same inputs (its real activations) -> one KernelCheck per call.
    Returns (the VM's result with tensors as numpy arrays, checks)."""
    device = device or OpenCLDevice()
    sections, plans = opencl_sections(device_exec), launch_plans(scheduled_mod, target)
    reference, checks = LLVMReference(plans), []
    prefix = f"arkinfer.opencl_check.{id(device):x}."

    def packed(plan: FuncPlan) -> Callable[..., None]:
        def call(*tensors) -> None:
            arrays = [t.numpy() if hasattr(t, "numpy") else t for t in tensors]
            got, widened = device.run(plan, sections, arrays)
            if check:
                checks.append(compare(plan, got, reference.run(plan, arrays), widened))
            for i, data in got.items():
                tensors[i].copyfrom(data)
        return call

    for name, plan in plans.items():
        tvm.register_global_func(prefix + name, packed(plan), override=True)

    unlowered: list[Any] = []

    def to_extern(call):
        op = call.op
        if isinstance(op, tvm.ir.GlobalVar) and op.name_hint in plans:  # VM-lowered (DPS call)
            return relax.Call(relax.ExternFunc(prefix + op.name_hint), call.args, call.attrs,
                              call.ty_args)
        if isinstance(op, tvm.ir.Op) and op.name.startswith("relax.call_tir") \
                and call.args[0].name_hint in plans:  # before dataflow lowering
            if op.name != "relax.call_tir" or len(call.args) > 2:
                raise NotAvailableError(f"{op.name} of {call.args[0].name_hint} with "
                                        f"{len(call.args) - 2} shape arguments: run_on_opencl "
                                        "takes plain call_tir", hint="check it per kernel "
                                        "with check_kernels")
            out = list(call.ty_args)
            unlowered.append(call)
            return relax.op.call_dps_packed(relax.ExternFunc(prefix + call.args[0].name_hint),
                                            call.args[1], out[0] if len(out) == 1 else out)
        return call

    host = tvm.IRModule({gv: tvm_ffi.structural_map(f, (relax.Call, to_extern))
                         if isinstance(f, relax.Function) else f
                         for gv, f in scheduled_mod.functions.items()
                         if gv.name_hint not in plans}, attrs=scheduled_mod.attrs)
    # a module before dataflow lowering still needs the (llvm) Relax pipeline; a lowered one not
    exe = tvm.compile(host, target=tvm.target.Target("llvm"),
                      relax_pipeline="default" if unlowered else None)
    vm = relax.VirtualMachine(exe, tvm.cpu())
    inputs = [tvm.runtime.tensor(a) if isinstance(a, np.ndarray) else a for a in args]
    return _numpy(vm[entry](*inputs)), checks


def _numpy(value: Any) -> Any:
    if hasattr(value, "numpy"):
        return value.numpy()
    if isinstance(value, (list, tuple)) or type(value).__name__ in ("Array", "List"):
        return [_numpy(v) for v in value]
    return value
