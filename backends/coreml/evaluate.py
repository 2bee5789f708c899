"""Run a MIL function on the host with coremltools' own op definitions (each op's
`value_inference`, the numpy code MIL uses for constant folding). This is how the saved
`.mlpackage` is executed on Linux, where Core ML's runtime (`MLModel.predict`) does not exist.

    fn = load_functions(package)["decode"]          # reloaded from the saved package
    ev = MilEvaluator(fn)
    out = ev.run({"tokens": ids, "start": np.array([n], np.int32)})   # states kept in ev.states

What it is, and is not: the arithmetic of the *program that was saved* (every op, every constant,
the constexpr dequantisation), numpy semantics; not Core ML's kernels. Differences from a device:
matmul / linear accumulate in fp32 and round once to the op's output dtype (numpy has no fast
fp16 GEMM; the GPU and Neural Engine accumulate in higher precision too), and elementwise fp16 ops
round per op as numpy does. Runtime parity on Core ML itself is checked on macOS only.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from arkinfer.errors import NotAvailableError

_ACCUMULATE_FP32 = ("matmul", "linear")


def _silu(x: np.ndarray) -> np.ndarray:
    xf = x.astype(np.float32)
    return (xf / (1.0 + np.exp(-xf))).astype(x.dtype)


# Ops whose coremltools definition has no value_inference: their documented formula in numpy.
FALLBACKS = {"silu": lambda op, env: _silu(env[op.inputs["x"].name])}


def load_functions(package: str | Path) -> dict[str, Any]:
    """name -> MIL Function of a saved .mlpackage (coremltools' milproto loader; no Core ML)."""
    import coremltools as ct
    from coremltools.converters.mil.frontend.milproto.load import load as milproto_load

    model = ct.models.MLModel(str(package), skip_model_load=True)
    spec = model.get_spec()
    prog = milproto_load(spec, spec.specificationVersion, model.weights_dir)
    return dict(prog.functions)


class MilEvaluator:
    """Evaluates one MIL function op by op; `states` holds the state tensors between calls."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.states: dict[str, np.ndarray] = {}
        self._const: dict[str, np.ndarray] = {}
        for name, var in fn.inputs.items():
            if _is_state(var):
                self.states[name] = np.zeros(var.shape, _np_dtype(var.dtype))
        self.state_names = sorted(self.states)

    def reset(self) -> None:
        for arr in self.states.values():
            arr[...] = 0

    def _constant(self, op: Any) -> list[np.ndarray]:
        if op.name not in self._const:
            out = op.outputs[0]
            if op.op_type == "const":
                val = out.val
            else:  # constexpr_*: the dequantised weight, materialised once
                val = op.materialized_val_inference()
            if isinstance(val, np.bool_):  # numpy's keepdims= and friends want a Python bool
                val = bool(val)
            self._const[op.name] = val  # strings stay Python values
        return [self._const[op.name]]

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        env: dict[str, Any] = {}
        for name, var in self.fn.inputs.items():
            if _is_state(var):
                env[name] = ("state", name)
            elif name not in inputs:
                raise NotAvailableError(f"MIL function input {name!r} was not given",
                                        hint=f"inputs: {', '.join(self.fn.inputs)}")
            else:
                env[name] = np.asarray(inputs[name]).astype(_np_dtype(var.dtype))
        # inf / NaN are part of the semantics (InfLLM v2's scores), not accidents to report;
        # coremltools logs a warning for every int64 -> int32 index it stores (topk, range)
        log = logging.getLogger("coremltools")
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                for op in self.fn.operations:
                    env.update(zip((o.name for o in op.outputs), self._op(op, env)))
        finally:
            log.setLevel(level)
        return {o.name: env[o.name] for o in self.fn.outputs}

    def _op(self, op: Any, env: dict[str, Any]) -> list[Any]:
        if op.op_type == "const" or op.op_type.startswith("constexpr_"):
            return self._constant(op)
        if op.op_type == "read_state":
            return [self.states[env[op.inputs["input"].name][1]].copy()]
        if op.op_type == "coreml_update_state":
            name = env[op.inputs["state"].name][1]
            value = env[op.inputs["value"].name]
            self.states[name] = np.asarray(value).astype(self.states[name].dtype)
            return [self.states[name]]
        if op.op_type in FALLBACKS:
            return [FALLBACKS[op.op_type](op, env)]
        if op.op_type == "shape":
            return [np.array(np.shape(env[op.inputs["x"].name]), np.int32)]
        from coremltools.converters.mil.mil import types

        saved = []
        for var in _input_vars(op):
            saved.append((var, var._sym_val, var._sym_type))
            value = env[var.name]
            if op.op_type in _ACCUMULATE_FP32 and getattr(value, "dtype", None) == np.float16:
                value = value.astype(np.float32)
            var._sym_val = SimpleNamespace(val=value)
            if isinstance(value, np.ndarray) and value.ndim and types.is_tensor(var._sym_type):
                # ops that read shapes from the type (expand_dims, ...) see the concrete shape
                var._sym_type = types.tensor(types.numpy_type_to_builtin_type(value.dtype),
                                             value.shape)
        try:
            vals = op.value_inference()
        except NotImplementedError:
            raise NotAvailableError(f"MIL op {op.op_type!r} ({op.name}) has no host evaluation",
                                    hint="only Core ML on macOS runs this op") from None
        finally:
            for var, old_val, old_type in saved:
                var._sym_val, var._sym_type = old_val, old_type
        vals = list(vals) if isinstance(vals, (tuple, list)) else [vals]
        out = []
        for var, val in zip(op.outputs, vals):
            want = _np_dtype(var.dtype)
            arr = np.asarray(val)
            out.append(arr.astype(want) if want is not None and arr.dtype != want else arr)
        return out


def _input_vars(op: Any) -> list[Any]:
    out = []
    for v in op.inputs.values():
        out.extend(v if isinstance(v, (list, tuple)) else [v])
    return out


def _is_state(var: Any) -> bool:
    from coremltools.converters.mil.mil import types

    return types.is_state(var.sym_type)


def _np_dtype(dtype: Any) -> Any:
    from coremltools.converters.mil.mil import types

    if types.is_state(dtype) if hasattr(types, "is_state") else False:
        return None
    try:
        return types.nptype_from_builtin(dtype)
    except Exception:  # noqa: BLE001 - states / lists have no numpy dtype
        return None
