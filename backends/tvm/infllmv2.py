"""InfLLM v2 attention as Relax: the kernels of kernels_infllmv2.py (stage 1) and
kernels_attention.py (stage 2, masked by the selection; for one decode query on the host,
kernels_sparse_decode.py's block gather) emitted into a BlockBuilder. The model
lowering (lower_relax `attention` with a sparse_config) and the standalone module the conformance
suite runs (`InfLLMv2Module`) both use `emit_infllmv2`, so they are the same kernels.

    out, rank, fine, coarse = emit_infllmv2(bb, q, k, v, group, cfg, scale, length, dense_len)
        q [B, Hq, T, D], k/v [B, Hkv, L, D] (L a plain shape variable), f32; group = Hq / Hkv
        out    [B, Hkv, G, T, D]   (a free reshape gives [B, Hq, T, D])
        rank   int32 [B, Hkv, T, ceil(L / block)]  (kernels_infllmv2.block_rank)
        fine   [B, Hkv, L // stride + 1, D], coarse likewise (rows >= n_kernels(L) are unused)
        dense_len: int, or an int64 shape variable (a runtime argument); the §5 switch
                   `sparse_switch(L, dense_len)` is evaluated inside the kernels
        gather: one decode query (T = 1) of a host (llvm) module: stage 2 is
                kernels_sparse_decode's block gather instead of the masked dense softmax
                (when head_dim is a multiple of its 8 lanes; else the masked softmax)

The cache is functional (the IR's): every call compresses the whole cache again, which the
spec defines as equal to incremental compression (the IR interpreter does the same).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import relax
from tvm import tirx as tir

from arkinfer.ops.infllmv2.config import SparseConfig

from . import kernels_attention as ka
from . import kernels_infllmv2 as ki
from . import kernels_sparse_decode


def sparse_switch(length, dense_len):
    """Boolean PrimExpr: the call over L keys runs sparse (`not SparseConfig.is_dense(L)`);
    `dense_len` an int or an int64 shape variable (-1: always sparse)."""
    if isinstance(dense_len, int):
        if dense_len < 0 or isinstance(length, int):
            return tir.const(dense_len < 0 or length >= dense_len, "bool")
        return length >= dense_len
    return tir.any(dense_len < 0, length >= dense_len)


def emit_infllmv2(bb: relax.BlockBuilder, q, k, v, group: int, cfg: SparseConfig, scale: float,
                  length: tir.Var, dense_len, gather: bool = False) -> tuple[Any, Any, Any, Any]:
    sz = ki.Sizes.of(cfg)
    # Sizes and floats travel in closures (emit_te converts only tensors and PrimExprs); the
    # switch's variables (L, and dense_len when it is one) are passed as plain shape variables
    # and the switch is built inside each kernel (FuseTIR takes single variables only).
    sw = [length] + ([dense_len] if isinstance(dense_len, tir.Var) else [])

    def on(n, *d):
        return sparse_switch(n, d[0] if d else dense_len)

    def emit(fn, *args, name: str):
        return bb.emit_te(fn, *args, *sw, primfunc_name_hint=name)

    fine = bb.emit_te(lambda x: ki.compress(x, sz.kernel, sz.stride), k,
                      primfunc_name_hint="infllm_compress")
    coarse = bb.emit_te(lambda x: ki.compress(x, sz.coarse_kernel, sz.coarse_stride), k,
                        primfunc_name_hint="infllm_compress_coarse")
    # the kernel counts as plain shape variables (L // stride + 1 otherwise): dlight's Matmul
    # rule on Mali pads an expression extent into a local buffer OpenCL codegen refuses
    fine, coarse = (_plain_rows(bb, x, name) for x, name in ((fine, "N1"), (coarse, "N2")))
    coarse_dots = emit(lambda a, c, *n: ki.kernel_dots(a, c, group, on(*n)), q, coarse,
                       name="infllm_coarse_dots")
    lse = emit(lambda x, *n: ki.coarse_lse(x, n[0], sz, scale, on(*n)), coarse_dots,
               name="infllm_coarse_lse")
    fine_dots = emit(lambda a, f, *n: ki.kernel_dots(a, f, group, on(*n)), q, fine,
                     name="infllm_fine_dots")
    s = emit(lambda x, e, *n: ki.group_scores(x, e, n[0], sz, scale, on(*n)), fine_dots, lse,
             name="infllm_group_scores")
    # pooling and the forced / future rules in one PrimFunc (FuseOps would fuse them anyway,
    # and FuseTIR cannot merge two calls that take L as a scalar)
    ranked = bb.emit_te(lambda x, n: ki.ranking_scores(ki.block_scores(x, n, sz), n, sz), s,
                        length, primfunc_name_hint="infllm_block_scores")
    rank = emit(lambda x, y, *n: ki.block_rank(x, y, on(*n)), ranked, ranked,
                name="infllm_block_rank")
    batch, hq, _, dim = (q.ty.shape[i] for i in range(4))
    if gather and kernels_sparse_decode.supported(int(dim)):   # stage 2 over the selected blocks
        hkv = int(k.ty.shape[1])
        func = kernels_sparse_decode.sparse_decode_attention(int(hq), hkv, int(dim), sz.block,
                                                             sz.budget, scale)
        limit = dense_len if isinstance(dense_len, tir.Var) else tir.IntImm("int64", dense_len)
        out = bb.emit(relax.call_tir(
            bb.add_func(func, "infllm_sparse_decode"),
            [q, k, v, rank, length, limit],
            relax.TensorType([batch, hkv, group, 1, dim], "float32")))
        return out, rank, fine, coarse
    scores = bb.emit_te(ka.attention_scores, q, k, scale, primfunc_name_hint="attention_scores")
    probs = emit(lambda sc, r, *n: ka.masked_softmax(sc, ki.sparse_visible(r, sz, on(*n))),
                 scores, rank, name="infllm_sparse_softmax")
    out = bb.emit_te(ka.attention_mix, probs, v, primfunc_name_hint="attention_mix")
    return out, rank, fine, coarse


def _plain_rows(bb: relax.BlockBuilder, x, name: str):
    shape = list(x.ty.shape)
    shape[2] = tir.Var(name, "int64")
    return bb.match_cast(x, relax.TensorType(shape, "float32"))


class InfLLMv2Module:
    """One compiled InfLLM v2 attention for fixed head counts, head_dim, config (all but
    dense_len) and scale, and any batch and T <= L: `run(q, k, v, sparse)` ->
    (out [B, Hq, T, D], idx [B, Hkv, T, budget] int64, fine [B, Hkv, n1, D], coarse
    [B, Hkv, n2, D]) as numpy float32 / int64. `sparse` is the call's dense <-> sparse decision
    (the model lowering computes it from L and dense_len inside the kernels; here the caller
    passes it). Compiled for llvm (this machine) with two functions, as the host model module
    has: `main` (any T; stage 2 masked dense) and `decode` (T = 1; stage 2 the block gather of
    kernels_sparse_decode.py), which `run` uses for one query unless `gather=False`."""

    def __init__(self, hq: int, hkv: int, dim: int, cfg: SparseConfig, scale: float) -> None:
        import tvm

        from .default_pipeline import finish, host_target, schedule

        self.cfg = cfg
        bb = relax.BlockBuilder()
        for name, t_new in (("main", tir.Var("T", "int64")), ("decode", 1)):
            batch, length = tir.Var("B", "int64"), tir.Var("L", "int64")
            flag = tir.Var("dense_len", "int64")
            q = relax.Var("q", relax.TensorType([batch, hq, t_new, dim], "float32"))
            k = relax.Var("k", relax.TensorType([batch, hkv, length, dim], "float32"))
            v = relax.Var("v", relax.TensorType([batch, hkv, length, dim], "float32"))
            flags = relax.Var("flags", relax.ShapeType([flag]))
            with bb.function(name, [q, k, v, flags]):
                with bb.dataflow():
                    out, rank, fine, coarse = emit_infllmv2(bb, q, k, v, hq // hkv, cfg, scale,
                                                            length, flag, gather=t_new == 1)
                    sz = ki.Sizes.of(cfg)
                    idx = bb.emit_te(lambda r, n: ki.selected_blocks(r, n, sz), rank, length,
                                     primfunc_name_hint="infllm_selected_blocks")
                    out = bb.emit(relax.op.reshape(out, [batch, hq, t_new, dim]))
                    result = bb.emit_output(relax.Tuple([out, idx, fine, coarse]))
                bb.emit_func_output(result)
        target = host_target()
        self.vm = relax.VirtualMachine(finish(schedule(bb.get(), target), target), tvm.cpu())

    def run(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, sparse: bool, gather: bool = True
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        import tvm

        from arkinfer.ops.infllmv2.common import n_kernels

        args = [tvm.runtime.tensor(np.ascontiguousarray(a, np.float32)) for a in (q, k, v)]
        dense_len = -1 if sparse else 2 ** 62  # the caller's decision, whatever this chunk's L
        entry = "decode" if gather and q.shape[2] == 1 else "main"
        out, idx, fine, coarse = self.vm[entry](*args, tvm.runtime.ShapeTuple([dense_len]))
        length, c = k.shape[2], self.cfg
        n1 = n_kernels(length, c.kernel_size, c.kernel_stride)
        n2 = n_kernels(length, c.coarse_kernel_size, c.coarse_kernel_stride)
        return (out.numpy(), idx.numpy(), fine.numpy()[:, :, :n1],
                coarse.numpy()[:, :, :n2])
