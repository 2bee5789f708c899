"""The coreml backend's InfLLM v2 (backends/coreml/infllmv2.py: `infllmv2_attention`, the MIL
composite program.py emits for a sparse attention node, with `selection` and `compress` for the
block indices and the compressed keys, and `sparse_attention` alone for stage 2), built as a
small ML program per call shape and run by Core ML's `predict` (CPU, fp32) — which exists on
macOS only.

Anywhere else this file raises ImportError at import, so conftest.py reports `coreml` as skipped
with the reason. `ARKINFER_COREML_CONFORMANCE=mil` runs the same converted programs instead under
the backend's MIL evaluator (backends/coreml/evaluate.py: coremltools' numpy op definitions, what
the backend's Linux runner uses), reported as `coremltools_mil`: the composite's semantics, not
Core ML's kernels.

The program of one call shape (inputs fp32 / int32, no state):

    q [1, Hq, C, D]      C queries of the call (a chunk of it: the gathered K / V are
                         [Hkv, C, budget * block_size, D]; the last chunk is padded)
    k, v [1, Hkv, Smax, D]  the cache, zero-padded to a multiple of block_size (padding is never
                         visible: visibility and causality follow the positions)
    pos int32 [C]        the queries' absolute positions
    total int32 [1]      cache_len + T of the whole call: the composite switches dense / sparse on
                         `start + t`, so it gets start = total, t = 0, and every chunk of a call
                         takes the call's path
    -> out fp32 [1, Hq, C, D], idx int32 [1, Hkv, C, budget] (-1 unused),
       fine / coarse fp32 [1, Hkv, n(Smax), D]

Stateless like the backend (its state is the KV cache): every call compresses the whole cache,
and the returned state is the program's own compressed keys. bf16 inputs widen to fp32 exactly
and the output is rounded back (the Core ML model itself keeps its cache in fp16: not checked
here). Allocations are Core ML's, invisible to torch: no no-L^2 check; the dense path is the
composite's own, compared with tolerance. Batch B runs as B calls (the composite is batch 1).
"""

import os
import shutil
import sys

import numpy as np
import torch
from infllmv2_checks import Infllmv2Impl

_MODES = ("runtime", "mil")
MODE = os.environ.get("ARKINFER_COREML_CONFORMANCE", "runtime")
if MODE not in _MODES:
    raise ValueError(f"ARKINFER_COREML_CONFORMANCE={MODE!r}; use one of {_MODES}")
_MIL_HINT = ("ARKINFER_COREML_CONFORMANCE=mil runs the same programs under coremltools' MIL "
             "evaluator instead (not Core ML's kernels)")
# An ImportError here is reported by conftest.py as a skip with this reason.
if MODE == "runtime" and sys.platform != "darwin":
    raise ImportError(f"Core ML's runtime (MLModel.predict) runs on macOS only, this is "
                      f"{sys.platform}; {_MIL_HINT}")
try:
    import coremltools as ct
except ImportError as exc:
    raise ImportError(f"coremltools is not importable ({exc}): pip install 'arkinfer[coreml]'"
                      ) from None
if MODE == "runtime":
    try:
        import coremltools.libcoremlpython
    except ImportError as exc:
        raise ImportError(f"coremltools has no Core ML runtime here ({exc}); {_MIL_HINT}"
                          ) from None

from arkinfer.backends.coreml import infllmv2 as coreml_infllmv2
from arkinfer.backends.coreml.evaluate import MilEvaluator, load_functions
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import Function, Program, types

from arkinfer.ops.infllmv2.common import CompressedKeys, check_inputs, n_kernels

_GATHER_KEYS = 1 << 16   # gathered key rows per program call: C * budget * block_size at most
_PROGRAMS: dict[tuple, object] = {}


def _inputs(hq: int, hkv: int, d: int, c: int, smax: int, **more: tuple) -> dict:
    """Placeholders q, k, v, pos (module docstring) and `more` int32 ones, name -> shape."""
    return {"q": mb.placeholder(shape=(1, hq, c, d), dtype=types.fp32),
            "k": mb.placeholder(shape=(1, hkv, smax, d), dtype=types.fp32),
            "v": mb.placeholder(shape=(1, hkv, smax, d), dtype=types.fp32),
            "pos": mb.placeholder(shape=(c,), dtype=types.int32),
            **{name: mb.placeholder(shape=shape, dtype=types.int32)
               for name, shape in more.items()}}


def _function(hq: int, hkv: int, d: int, c: int, smax: int, config, scale: float) -> Function:
    """The MIL function of one call shape (module docstring)."""
    inputs = _inputs(hq, hkv, d, c, smax, total=(1,))
    with Function(inputs, opset_version=ct.target.iOS18) as fn:
        q, k, v, pos, total = (fn.inputs[n] for n in ("q", "k", "v", "pos", "total"))
        out = coreml_infllmv2.infllmv2_attention(q, k, v, pos, total, 0, config, scale, "fp32")
        idx = coreml_infllmv2.selection(q, k, pos, config, scale)
        fine = coreml_infllmv2.compress(k, config.kernel_size, config.kernel_stride)
        coarse = coreml_infllmv2.compress(k, config.coarse_kernel_size,
                                          config.coarse_kernel_stride)
        fn.set_outputs([mb.identity(x=out, name="out"), mb.identity(x=idx, name="idx"),
                        mb.identity(x=fine, name="fine"), mb.identity(x=coarse, name="coarse")])
    return fn


def _stage2_function(hq: int, hkv: int, d: int, c: int, smax: int, w: int, config,
                     scale: float) -> Function:
    """Stage 2 alone: the inputs above without total, plus idx int32 [1, Hkv, C, w] (-1 unused;
    Core ML takes no bool inputs, so `valid` is idx >= 0) -> out fp32 [1, Hq, C, D]."""
    inputs = _inputs(hq, hkv, d, c, smax, idx=(1, hkv, c, w))
    with Function(inputs, opset_version=ct.target.iOS18) as fn:
        q, k, v, pos, idx = (fn.inputs[n] for n in ("q", "k", "v", "pos", "idx"))
        valid = mb.greater_equal(x=idx, y=np.int32(0))
        out = coreml_infllmv2.sparse_attention(q, k, v, pos, mb.maximum(x=idx, y=np.int32(0)),
                                               valid, config, scale)
        fn.set_outputs([mb.identity(x=out, name="out")])
    return fn


def _compile(fn: Function):
    """The converted program as a callable {input: array} -> {output: array}: Core ML's predict
    (macOS), or the MIL evaluator over the converted program reloaded from its package."""
    prog = Program()
    prog.add_function("main", fn)
    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
                       compute_precision=ct.precision.FLOAT32,
                       compute_units=ct.ComputeUnit.CPU_ONLY, skip_model_load=MODE == "mil")
    if MODE == "runtime":
        return model.predict
    main = load_functions(model.package_path)["main"]
    if getattr(model, "is_temp_package", False):
        shutil.rmtree(model.package_path, ignore_errors=True)
    return MilEvaluator(main).run


def _program(build, *key):
    """The compiled program of `build(*key)`, made once per key."""
    if (build, *key) not in _PROGRAMS:
        _PROGRAMS[(build, *key)] = _compile(build(*key))
    return _PROGRAMS[(build, *key)]


def _padded(x: torch.Tensor, smax: int) -> np.ndarray:
    """[Hkv, S, D] -> fp32 [1, Hkv, smax, D], zeros after S."""
    out = np.zeros((1, x.shape[0], smax, x.shape[2]), np.float32)
    out[0, :, :x.shape[1]] = x.float().numpy()
    return out


def attention(q, k, v, *, config, scale, cache_len, state=None, q_sel=None, k_sel=None):
    check_inputs(q, k, v, cache_len, config, state, q_sel, k_sel)
    batch, hq, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    smax = -(-s // config.block_size) * config.block_size
    width = min(config.budget, smax // config.block_size) * config.block_size
    c = min(t, max(1, _GATHER_KEYS // width))
    run = _program(_function, hq, hkv, d, c, smax, config, float(scale))
    total = np.array([s], np.int32)
    outs, idxs, fine, coarse = [], [], [], []
    for b in range(batch):
        kb, vb = _padded(k[b], smax), _padded(v[b], smax)
        rows_out, rows_idx = [], []
        for lo in range(0, t, c):
            n = min(c, t - lo)
            pos = np.arange(cache_len + lo, cache_len + lo + c, dtype=np.int32)
            pos[n:] = pos[n - 1]                     # padded rows repeat the last query
            qc = np.zeros((1, hq, c, d), np.float32)
            qc[:, :, :n] = q[b:b + 1, :, lo:lo + n].float().numpy()
            got = run({"q": qc, "k": kb, "v": vb, "pos": pos, "total": total})
            rows_out.append(got["out"][:, :, :n])
            rows_idx.append(got["idx"][:, :, :n])
        outs.append(np.concatenate(rows_out, 2))
        idxs.append(np.concatenate(rows_idx, 2))
        fine.append(got["fine"][:, :, :n_kernels(s, config.kernel_size, config.kernel_stride)])
        coarse.append(got["coarse"][:, :, :n_kernels(s, config.coarse_kernel_size,
                                                     config.coarse_kernel_stride)])
    out = torch.from_numpy(np.concatenate(outs)).to(q.dtype)
    if config.is_dense(s):
        return out, state, None
    keys = CompressedKeys(torch.from_numpy(np.concatenate(fine)),
                          torch.from_numpy(np.concatenate(coarse)), s)
    return out, keys, torch.from_numpy(np.concatenate(idxs)).to(torch.int64)


def stage2(q, k, v, idx, *, config, scale, cache_len):
    batch, hq, t, d = q.shape
    hkv, s, w = k.shape[1], k.shape[2], idx.shape[-1]
    smax = -(-s // config.block_size) * config.block_size
    # One program for all T queries (the suite's hand-made idx cover at most 150 of them).
    run = _program(_stage2_function, hq, hkv, d, t, smax, w, config, float(scale))
    pos = np.arange(cache_len, cache_len + t, dtype=np.int32)
    outs = [run({"q": q[b:b + 1].float().numpy(), "k": _padded(k[b], smax),
                 "v": _padded(v[b], smax), "pos": pos,
                 "idx": idx[b:b + 1].numpy().astype(np.int32)})["out"] for b in range(batch)]
    return torch.from_numpy(np.concatenate(outs)).to(q.dtype)


IMPL = Infllmv2Impl("coreml" if MODE == "runtime" else "coremltools_mil", attention,
                    stage2=stage2, tracks_memory=False, sparse_is_fast=False, exact_dense=False)
