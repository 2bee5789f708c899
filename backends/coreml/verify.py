"""What can be checked about a Core ML package on a machine without Core ML (Linux), honestly.

    checks = run_checks(package, src, program)     # dict, written to coreml_checks.json

1. `weight_check`: reload the *saved* package's MIL program (milproto loader) and compare every
   `constexpr_blockwise_shift_scale` with the canonical quantised weight the recipe produced
   (codes, scales bit for bit, zero points); every quantised linear of the source must be there.
2. `opset_check`: every op of every function is a core MIL op available at iOS 18 (not a dialect
   or custom op, none newer than the deployment target); states and the functions are listed.
3. `composite_check`: the attention and InfLLM v2 composites evaluated by MIL constant folding
   (value inference) on small random inputs against arkinfer/ops/infllmv2/reference.py: the
   selected blocks equal, outputs within fp32 tolerance.

Not checkable here: Core ML's own kernels (CPU / GPU / Neural Engine), i.e. runtime parity —
deferred to macOS, where the runner uses `MLModel.predict` and the tests run it.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import numpy as np

from .weights import SourceWeights, canonical_from_blockwise, mil_name

OP = "constexpr_blockwise_shift_scale"
# Ops of coremltools' `coreml` namespace that the iOS 18 ML-program backend writes as they are
# (the state write Core ML's stateful models use: the spec's `coreml_update_state`).
COREML_NAMESPACE_OPS = {"coreml_update_state": "iOS18 state write (coreml namespace)"}


def package_weights(package: str | Path) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """function -> op name -> {"data", "scale", "offset"?, "signed"} of every
    constexpr_blockwise_shift_scale in the saved package."""
    from coremltools.converters.mil.mil import types

    from .evaluate import load_functions

    out: dict[str, dict[str, dict[str, Any]]] = {}
    for fname, fn in load_functions(package).items():
        found = {}
        for op in fn.operations:
            if op.op_type != OP:
                continue
            kind = types.builtin_to_string(op.data.dtype)              # int4, uint4, int8, ...
            entry = {"data": np.asarray(op.data.val), "scale": np.asarray(op.scale.val),
                     "signed": not kind.startswith("u"), "bits": kind}
            if op.offset is not None:
                entry["offset"] = np.asarray(op.offset.val)
            found[op.name] = entry
        out[fname] = found
    return out


def weight_check(package: str | Path, src: SourceWeights, program: Any) -> dict[str, Any]:
    """Compare the package's blockwise weights with the canonical ones (module docstring)."""
    stored = package_weights(package)
    names = sorted({n.attrs["weight"] for g in program.entries.values() for n in g.nodes
                    if str(n.op) == "linear"})
    checked, problems = 0, []
    for name in names:
        qw = src.quantised(name, tuple(program.weights[name].type.shape))
        if qw is None:
            continue
        for fname, ops in stored.items():
            got = ops.get(mil_name(name))
            if got is None:
                problems.append(f"{fname}: {name} is quantised in the source but not stored as "
                                f"{OP}")
                continue
            bits = 4 if "4" in got["bits"] else 8
            back = canonical_from_blockwise(got["data"], got["scale"], got.get("offset"), bits,
                                            got["signed"], name)
            same = (np.array_equal(back.codes.numpy(), qw.codes.numpy())
                    and np.array_equal(back.zeros.numpy(), qw.zeros.numpy())
                    and np.array_equal(back.scales.numpy().view(np.int32),
                                       qw.scales.numpy().view(np.int32)))
            if not same:
                problems.append(f"{fname}: {name} differs from the canonical codes / scales")
            checked += 1
    return {"passed": not problems, "checked": checked, "problems": problems,
            "functions": sorted(stored)}


def opset_check(package: str | Path) -> dict[str, Any]:
    """Every op is a core MIL op available at iOS 18 (module docstring)."""
    import coremltools as ct
    from coremltools.converters.mil.mil.ops.registry import SSAOpRegistry

    from .evaluate import load_functions

    ios18 = ct.target.iOS18
    counts: dict[str, int] = {}
    bad: dict[str, str] = {}
    states: dict[str, list[int]] = {}
    for fname, fn in load_functions(package).items():
        for op in fn.operations:
            counts[op.op_type] = counts.get(op.op_type, 0) + 1
            versions = SSAOpRegistry.core_ops.get(op.op_type)
            if versions is None and op.op_type in COREML_NAMESPACE_OPS:
                continue
            if versions is None:
                bad[op.op_type] = "not a core MIL op (dialect or custom)"
            elif min(versions) > ios18:
                bad[op.op_type] = f"needs {min(versions).name}"
        for name, var in fn.inputs.items():
            if "_cache_" in name:
                states[name] = [int(d) for d in var.shape]
    return {"passed": not bad, "ops": dict(sorted(counts.items())), "outside_ios18": bad,
            "states": len(states), "state_shape": next(iter(states.values()), None)}


def composite_check(seed: int = 0) -> dict[str, Any]:
    """Attention and InfLLM v2 composites by MIL value inference vs the reference (fp32);
    computed once per process (it depends on the code only)."""
    return copy.deepcopy(_composite_check(seed))


@functools.cache
def _composite_check(seed: int) -> dict[str, Any]:
    import coremltools as ct
    import torch
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Function

    from arkinfer.ops.infllmv2 import reference as ref
    from arkinfer.ops.infllmv2.common import dense_attention
    from arkinfer.ops.infllmv2.config import SparseConfig

    from . import composites as C
    from .infllmv2 import infllmv2_attention, selection

    cfg = SparseConfig(kernel_size=32, kernel_stride=16, block_size=64, init_blocks=1,
                       window_size=128, topk=3, dense_len=-1)
    gen = torch.Generator().manual_seed(seed)
    hq, hkv, d, smax = 4, 2, 16, 768
    results = []
    for length, t in ((640, 40), (700, 1), (333, 333)):  # chunk, decode step, one-shot prefill
        start = length - t
        q = torch.randn(1, hq, t, d, generator=gen)
        k = torch.randn(1, hkv, length, d, generator=gen)
        v = torch.randn(1, hkv, length, d, generator=gen)
        scale = d ** -0.5
        want, _, want_idx = ref.infllmv2_attention(q, k, v, config=cfg, scale=scale,
                                                   cache_len=start)
        want_dense = dense_attention(q, k, v, scale, start)
        kp = np.zeros((1, hkv, smax, d), np.float32)
        vp = np.zeros_like(kp)
        kp[:, :, :length], vp[:, :, :length] = k.numpy(), v.numpy()
        with Function({}, opset_version=ct.target.iOS18), np.errstate(over="ignore"):
            st = mb.const(val=np.array([start], np.int32))
            pos = C.positions(st, t)
            qc, kc, vc = mb.const(val=q.numpy()), mb.const(val=kp), mb.const(val=vp)
            sparse = infllmv2_attention(qc, kc, vc, pos, st, t, cfg, scale, "fp32").val
            idx = selection(qc, kc, pos, cfg, scale).val
            dense = C.attention(qc, kc, vc, pos, scale, "fp32").val
        results.append({
            "cache": length, "new_tokens": t,
            "idx_equal": bool(np.array_equal(idx, want_idx.numpy())),
            "infllmv2_max_abs_diff": float(np.abs(sparse - want.numpy()).max()),
            "dense_max_abs_diff": float(np.abs(dense - want_dense.numpy()).max())})
    passed = all(r["idx_equal"] and r["infllmv2_max_abs_diff"] < 1e-4
                 and r["dense_max_abs_diff"] < 1e-4 for r in results)
    return {"passed": passed, "config": cfg.to_dict(), "cases": results,
            "tolerance": "idx equal; max |diff| < 1e-4 (fp32)"}


def run_checks(package: str | Path, src: SourceWeights, program: Any, *,
               quantised: bool = True) -> dict[str, Any]:
    """All three checks and a summary (lines for the manifest's notes). `quantised=False` when
    coremltools.optimize re-quantised the package (no canonical codes to compare)."""
    weights = weight_check(package, src, program) if quantised and src.format else None
    opset = opset_check(package)
    composites = composite_check()
    summary = []
    if weights is not None:
        summary.append(f"weights: {weights['checked']} quantised linears in the saved package "
                       f"equal the canonical codes and scales" if weights["passed"] else
                       "weights: MISMATCH " + "; ".join(weights["problems"][:3]))
    summary.append(f"op set: {len(opset['ops'])} MIL op types, all in the iOS 18 opset"
                   if opset["passed"] else f"op set: outside iOS 18: {opset['outside_ios18']}")
    summary.append("composites (value inference vs reference): attention and InfLLM v2 "
                   + ("match" if composites["passed"] else "DIFFER"))
    passed = all(c is None or c["passed"] for c in (weights, opset, composites))
    return {"passed": passed, "weights": weights, "opset": opset, "composites": composites,
            "summary": summary, "runtime_parity": "deferred to macOS"}
