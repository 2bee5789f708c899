"""Copies of named tensors of llama.cpp's graph as it computes them (ggml's `cb_eval`, the way
llama.cpp's eval-callback tool reads a graph).

llama.cpp names graph nodes `<name>-<layer>`: `l_out-3` is the residual stream after decoder block
3 (every model graph), the InfLLM v2 build adds `infllm_idx-<layer>` and `infllm_chunk_sum-<layer>`.
A capture answers ggml's "do you want this node?" question for each node of every evaluation and
keeps a copy of each wanted one, per name, in evaluation order (one array per ubatch):

    capture = GraphCapture(lib_dir, wants=lambda name: name in {"l_out-0", "l_out-1"})
    attach(runner, capture)        # runner.llm gets a new context whose graph calls it back
    runner.prefill(ids); capture.tensors["l_out-0"]   # [array [T, H] float32]

Arrays are ggml's `ne` reversed: [ne3, ne2, ne1, ne0] (an F32 activation [H, T] reads [T, H]).
Only F32 and I32 tensors can be captured.

`GraphCapture` answers from Python: ggml asks about every node, so a decode step of a small model
pays ~0.5 ms of Python calls. `NativeCapture` (tap_capture.c, compiled once per machine) answers
in C and copies F32 rows of a fixed set of names into numpy buffers: what speculative decoding's
taps use; `capture_of` picks it where it builds, else GraphCapture.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable
from pathlib import Path

import numpy as np

GGML_DTYPES = {0: np.float32, 26: np.int32}  # GGML_TYPE_F32, GGML_TYPE_I32


def library_dir() -> Path:
    """The folder of the libllama / libggml-base the imported llama_cpp module loaded."""
    import llama_cpp

    return Path(llama_cpp.__file__).parent / "lib"


class GraphCapture:
    """A cb_eval callback copying the graph tensors whose name `wants` accepts; `tensors` maps a
    name to the copies made since the last `clear()`, one array per evaluation (ubatch)."""

    def __init__(self, lib_dir: Path, wants: Callable[[str], bool]) -> None:
        import llama_cpp

        base = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
        base.ggml_get_name.restype = ctypes.c_char_p
        base.ggml_get_name.argtypes = [ctypes.c_void_p]
        base.ggml_get_data.restype = ctypes.c_void_p
        base.ggml_get_data.argtypes = [ctypes.c_void_p]
        self.tensors: dict[str, list[np.ndarray]] = {}

        def callback(tensor, ask, _user):
            want = wants(base.ggml_get_name(tensor).decode())
            if ask or not want:
                return want if ask else True
            # struct ggml_tensor: enum ggml_type (int32, padded to 8), buffer pointer, int64_t ne[4]
            dtype = GGML_DTYPES[ctypes.c_int32.from_address(tensor).value]
            ne = list((ctypes.c_int64 * 4).from_address(tensor + 16))
            count = ne[0] * ne[1] * ne[2] * ne[3]
            raw = (ctypes.c_char * (count * 4)).from_address(base.ggml_get_data(tensor))
            array = np.frombuffer(bytes(raw), dtype=dtype).reshape(ne[::-1])
            self.tensors.setdefault(base.ggml_get_name(tensor).decode(), []).append(array)
            return True

        # kept on the instance: ctypes frees a callback whose Python object is collected
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(callback)

    def clear(self) -> None:
        self.tensors = {}


class NativeCapture:
    """tap_capture.c's callback over the F32 nodes `names` of width `width` (floats per row),
    at most `rows` rows per name between two `clear()`s; `tensors` as GraphCapture's, each name
    one array [rows written, width]."""

    def __init__(self, lib: ctypes.CDLL, lib_dir: Path, names: list[str], width: int,
                 rows: int) -> None:
        import llama_cpp

        if len(names) > 8 or any(len(n.encode()) >= 64 for n in names):
            raise ValueError(f"at most 8 names of < 64 bytes: {names}")
        base = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
        self.names, self.width = names, width
        self.buffers = [np.zeros(rows * width, dtype=np.float32) for _ in names]
        self._state = (ctypes.c_char * int(lib.tap_state_size()))()
        state = _TapState.from_buffer(self._state)
        for field, fn in (("get_name", base.ggml_get_name), ("get_data", base.ggml_get_data),
                          ("nelements", base.ggml_nelements)):
            setattr(state, field, ctypes.cast(fn, ctypes.c_void_p).value)
        state.count = len(names)
        for i, name in enumerate(names):
            state.names[i].value = name.encode()
            state.buffers[i] = self.buffers[i].ctypes.data
        state.capacity = rows * width
        self._view = state
        address = ctypes.cast(lib.tap_callback, ctypes.c_void_p).value
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(address)
        self.user_data = ctypes.cast(self._state, ctypes.c_void_p)

    @property
    def tensors(self) -> dict[str, list[np.ndarray]]:
        state = self._view
        if state.overflow or state.bad_type:
            raise RuntimeError("a captured tensor did not fit its buffer" if state.overflow
                               else "a captured tensor is not F32")
        return {name: [self.buffers[i][:state.used[i]].reshape(-1, self.width).copy()]
                for i, name in enumerate(self.names) if state.used[i]}

    def clear(self) -> None:
        for i in range(len(self.names)):
            self._view.used[i] = 0


class _TapState(ctypes.Structure):
    """tap_capture.c's tap_state, field for field."""

    _fields_ = [("get_name", ctypes.c_void_p), ("get_data", ctypes.c_void_p),
                ("nelements", ctypes.c_void_p), ("count", ctypes.c_int32),
                ("overflow", ctypes.c_int32), ("bad_type", ctypes.c_int32),
                ("pad", ctypes.c_int32), ("names", (ctypes.c_char * 64) * 8),
                ("buffers", ctypes.c_void_p * 8), ("capacity", ctypes.c_int64),
                ("used", ctypes.c_int64 * 8)]


def capture_of(names: list[str], width: int, rows: int):
    """A NativeCapture of the F32 nodes `names` where tap_capture.c builds on this machine,
    else a GraphCapture of the same names."""
    from arkinfer.native_build import NativeBuildError, load_library

    lib_dir = library_dir()
    try:
        lib = load_library("tap_capture", [Path(__file__).with_name("tap_capture.c")])
    except NativeBuildError:
        lib = None
    if lib is None:
        return GraphCapture(lib_dir, set(names).__contains__)
    lib.tap_state_size.restype = ctypes.c_int64
    return NativeCapture(lib, lib_dir, names, width, rows)


def attach(runner, capture: GraphCapture | NativeCapture) -> GraphCapture | NativeCapture:
    """Give `runner.llm` (a llama-cpp-python Llama) a new llama.cpp context whose graph callback
    is `capture`; the cache starts empty. Returns `capture`."""
    from llama_cpp import _internals

    llm = runner.llm
    llm.context_params.cb_eval = capture.callback
    llm.context_params.cb_eval_user_data = getattr(capture, "user_data", None)
    llm._ctx = llm._stack.enter_context(contextlib.closing(
        _internals.LlamaContext(model=llm._model, params=llm.context_params, verbose=False)))
    llm.reset()
    return capture
