"""llama-cpp-python itself: importing it (with the install command when it is missing), its log
output, and the KV cache types ArkInfer asks of it. Shared by the runner, parallel.py and
llamacpp_quantize.py (a module below both, so neither imports the other for these)."""

from __future__ import annotations

from arkinfer.errors import NotAvailableError

KV_TYPES = {"f32": 0, "f16": 1}  # ggml type ids

# ggml_log_level (ggml.h): llama-cpp-python 0.3.36 maps these one level off (a WARN is printed as
# an ERROR, an ERROR dropped as DEBUG), so the runner installs its own callback
LOG_WARN, LOG_ERROR, LOG_CONT = 3, 4, 5
# printed by llama.cpp when a context is freed and its compute buffer grew past the reserved
# size: InfLLM v2's sparse graphs outgrow the dense graph llama.cpp reserves for (harmless)
LOG_NOISE = ("does not match expectation",)
_LOG_STATE: dict = {}


def quiet_llama_logs(llama_cpp) -> None:
    """Install (once per process) a llama.cpp log callback that prints warnings and errors to
    stderr, info and debug lines not, and drops LOG_NOISE."""
    if "callback" in _LOG_STATE:
        return
    import ctypes
    import sys

    def callback(level, text, _user):
        if level == LOG_CONT:
            show = _LOG_STATE.get("last", False)
        else:
            line = text.decode("utf-8", errors="replace")
            show = level in (LOG_WARN, LOG_ERROR) and not any(n in line for n in LOG_NOISE)
            _LOG_STATE["last"] = show
        if show:
            sys.stderr.write(text.decode("utf-8", errors="replace"))
            sys.stderr.flush()

    _LOG_STATE["callback"] = llama_cpp.llama_log_callback(callback)   # kept alive here
    llama_cpp.llama_log_set(_LOG_STATE["callback"], ctypes.c_void_p(0))


def load_llama_cpp():
    """The llama_cpp module (llama-cpp-python); NotAvailableError with the install command when
    it is not installed. Shared by the runner, llamacpp_quantize.py and parallel.py."""
    try:
        import llama_cpp
    except ImportError:
        raise NotAvailableError("llama-cpp-python is not installed",
                                hint="pip install 'arkinfer[gguf]' (compiles llama.cpp, ~5 min)") from None
    return llama_cpp
