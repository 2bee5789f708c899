"""Run the `arkinfer.InfLLMv2Attention` function alone in onnxruntime, with the calling convention
of `arkinfer.ops.infllmv2.infllmv2_attention` (torch in, torch out): what the conformance suite
(tests/conformance/impls/onnx_function.py) and the backend tests call.

The one-node model takes float32 q/k/v and casts them to the requested dtype inside the graph
(numpy has no bfloat16), so the function itself sees bf16 / f16 / f32 tensors; the output is cast
back to float32 and returned in q's dtype (exact: it was produced in that dtype).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper

from arkinfer.ops.infllmv2 import CompressedKeys, SparseConfig

from . import fn_infllmv2
from .onnx_build import DOMAIN, DOMAIN_VERSION, IR_VERSION, OPSET

_ELEM = {torch.float32: TensorProto.FLOAT, torch.bfloat16: TensorProto.BFLOAT16,
         torch.float16: TensorProto.FLOAT16}


def attention_model(config: SparseConfig, scale: float, dtype: torch.dtype) -> onnx.ModelProto:
    """A model with one InfLLMv2Attention node; inputs f32 q, k, v, fine_in, coarse_in."""
    elem = _ELEM[dtype]
    nodes = [helper.make_node("Cast", [n], [f"{n}_c"], to=elem) for n in ("q", "k", "v")]
    nodes.append(helper.make_node(fn_infllmv2.NAME, ["q_c", "k_c", "v_c", "fine_in", "coarse_in"],
                                  ["out_c", "fine_out", "coarse_out", "idx"], domain=DOMAIN,
                                  **fn_infllmv2.node_attrs(config.to_dict(), scale)))
    nodes.append(helper.make_node("Cast", ["out_c"], ["out"], to=TensorProto.FLOAT))
    f32 = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, f32, ["B", h, l, "D"]) for n, h, l in
              (("q", "Hq", "T"), ("k", "Hkv", "S"), ("v", "Hkv", "S"),
               ("fine_in", "Hkv", "N1"), ("coarse_in", "Hkv", "N2"))]
    outputs = [helper.make_tensor_value_info("out", f32, None),
               helper.make_tensor_value_info("fine_out", f32, None),
               helper.make_tensor_value_info("coarse_out", f32, None),
               helper.make_tensor_value_info("idx", TensorProto.INT64, None)]
    graph = helper.make_graph(nodes, "infllmv2_attention", inputs, outputs)
    return helper.make_model(graph, ir_version=IR_VERSION, functions=[fn_infllmv2.function()],
                             opset_imports=[helper.make_opsetid("", OPSET),
                                            helper.make_opsetid(DOMAIN, DOMAIN_VERSION)])


@lru_cache(maxsize=32)
def _session(config: SparseConfig, scale: float, dtype: torch.dtype) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    model = attention_model(config, scale, dtype)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def infllmv2_attention_ort(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                           config: SparseConfig, scale: float, cache_len: int,
                           state: CompressedKeys | None = None, q_sel=None, k_sel=None):
    """(out [B,Hq,T,D] in q.dtype, CompressedKeys of the S keys, idx [B,Hkv,T,budget] or None on
    a dense call), computed by onnxruntime running the ONNX function."""
    if q_sel is not None or k_sel is not None:
        raise ValueError("the ONNX InfLLMv2Attention function does not take pre-RoPE q_sel/k_sel "
                         "(use_nope=true is not supported)")
    b, hkv, s, d = k.shape
    if s != cache_len + q.shape[2]:
        raise ValueError(f"k/v hold {s} positions but cache_len={cache_len} + T={q.shape[2]}")
    empty = np.zeros((b, hkv, 0, d), np.float32)
    fine = empty if state is None else state.fine.float().numpy()
    coarse = empty if state is None else state.coarse.float().numpy()
    sess = _session(config, float(scale), q.dtype)
    out, fine_out, coarse_out, idx = sess.run(None, {
        "q": q.float().numpy(), "k": k.float().numpy(), "v": v.float().numpy(),
        "fine_in": fine, "coarse_in": coarse})
    keys = CompressedKeys(torch.from_numpy(fine_out), torch.from_numpy(coarse_out), s)
    sel = None if idx.shape[-1] == 0 else torch.from_numpy(idx)
    return torch.from_numpy(out).to(q.dtype), keys, sel
