"""The tensorrt backend's `arkinfer.InfLLMv2Attention` ONNX function, executed by onnxruntime.

Its body is the masked-dense formulation (O(T * S), like the reference), so the no-L^2 memory
check does not apply; allocations happen inside onnxruntime, invisible to torch.
"""

import pytest
from infllmv2_checks import Infllmv2Impl

pytest.importorskip("onnxruntime", reason="pip install 'arkinfer[onnx]'")

from arkinfer.backends.onnx.infllmv2_session import infllmv2_attention_ort

IMPL = Infllmv2Impl("onnx_function", infllmv2_attention_ort, tracks_memory=False,
                    sparse_is_fast=False, exact_dense=False)
