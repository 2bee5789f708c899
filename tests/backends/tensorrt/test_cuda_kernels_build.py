"""The CUDA kernels compile for sm_87 (Jetson Orin) and sm_90 (H100) wherever nvcc exists (a
compile failure fails the test), and the W4A16 kernel's Marlin index math, run on the host through
`arkinfer_marlin_dequant_host`, equals the numpy Marlin unpack. No GPU needed."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from arkinfer.backends.tensorrt.kernels import build
from arkinfer.quant.formats.marlin import MARLIN
from marlin_weights import random_marlin_weight

pytestmark = pytest.mark.skipif(build.nvcc() is None, reason="nvcc not found")


@pytest.mark.parametrize("source", build.SOURCES)
def test_compiles_for_sm87_and_sm90(source, tmp_path):
    obj = build.compile_objects(source, tmp_path, archs=(87, 90))
    assert obj.stat().st_size > 0


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    """The kernels library built for sm_90 into a fresh cache (its host functions run anywhere)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ARKINFER_CACHE", str(tmp_path_factory.mktemp("kernels")))
        return ctypes.CDLL(str(build.library_path(archs=(90,))))


@pytest.mark.parametrize(("n", "k", "group_size"), [(128, 256, 128), (192, 256, -1),
                                                     (64, 512, 32), (256, 384, 64)])
def test_kernel_index_math_reads_marlin_bytes(host_lib, n, k, group_size):
    lib = host_lib
    qw = random_marlin_weight(np.random.default_rng(n + k), n, k, group_size, 0.01, 0.1)
    packed = MARLIN.pack(qw)
    b = np.ascontiguousarray(packed["B"], dtype=np.int32)
    s = np.ascontiguousarray(packed["s"], dtype=np.float16).view(np.uint16)
    w = np.empty((k, n), np.float32)
    rc = lib.arkinfer_marlin_dequant_host(b.ctypes.data_as(ctypes.c_void_p),
                                          s.ctypes.data_as(ctypes.c_void_p),
                                          w.ctypes.data_as(ctypes.c_void_p), n, k, group_size)
    assert rc == 0
    ref = MARLIN.unpack(packed, n, k, group_size=group_size).dequantize()
    np.testing.assert_array_equal(w, ref.numpy().T)
