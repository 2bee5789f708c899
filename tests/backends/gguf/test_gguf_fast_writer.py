"""FastArrayWriter packs metadata arrays byte for byte as gguf-py's GGUFWriter (the reference),
and a whole lowered GGUF is identical either way."""

from __future__ import annotations

import pytest

gguf = pytest.importorskip("gguf")

from gguf import GGUFValueType  # noqa: E402

from arkinfer.backends.gguf.fast_writer import FastArrayWriter  # noqa: E402

CASES = [
    (["a", "bé", "", "\u0120the"] * 40, None),
    ([b"\x00\xff", b"ab"] * 40, None),
    ([float(i) / 3 for i in range(100)], None),
    ([1, -2, 3] * 30, None),
    ([True, False] * 40, None),
    (list(range(200)), GGUFValueType.UINT32),
    ([0.1] * 70, GGUFValueType.FLOAT64),
    (["x"] * 10, None),                 # short: gguf-py packs it
]


@pytest.mark.parametrize("val,sub", CASES)
def test_array_bytes_equal_gguf_py(val, sub):
    ours, ref = FastArrayWriter(None, "llama"), gguf.GGUFWriter(None, "llama")
    for add_vtype in (True, False):
        assert ours._pack_val(val, GGUFValueType.ARRAY, add_vtype, sub) == \
            ref._pack_val(val, GGUFValueType.ARRAY, add_vtype, sub)


def test_mixed_arrays_still_refused():
    with pytest.raises(ValueError, match="same type"):
        FastArrayWriter(None, "llama")._pack_val([1, "a"] * 40, GGUFValueType.ARRAY, True)
    with pytest.raises(ValueError, match="same type"):
        FastArrayWriter(None, "llama")._pack_val([1, True] * 40, GGUFValueType.ARRAY, True)


def test_lowered_demo_gguf_identical_to_gguf_py_writer(tmp_path, monkeypatch):
    from arkinfer.backend import LowerRequest
    from arkinfer.backends.gguf import lower as lower_mod
    from arkinfer.backends.gguf.backend import BACKEND
    from arkinfer.frontend.demo import demo_model_path

    demo = demo_model_path()
    BACKEND.lower(LowerRequest(demo, demo, None, "f32", None, tmp_path / "fast", options={}))
    monkeypatch.setattr(lower_mod, "FastArrayWriter", gguf.GGUFWriter)
    BACKEND.lower(LowerRequest(demo, demo, None, "f32", None, tmp_path / "ref", options={}))
    assert (tmp_path / "fast/model.gguf").read_bytes() == (tmp_path / "ref/model.gguf").read_bytes()
