"""Compile a small C library once per machine and load it with ctypes (ArkInfer's native kernels:
the InfLLM v2 decode step, the GGUF block quantiser).

    lib = load_library("gguf_quant", [Path(".../gguf_quant.c")], FLAGS)   # ctypes.CDLL | None

The library goes to ~/.cache/arkinfer/kernels (XDG_CACHE_HOME honoured) under a name keyed by
the sources, the compiler and the flags, written atomically (a temporary file renamed), so
concurrent processes are safe and a changed source is rebuilt. `openmp=True` tries -fopenmp
first (the library then shares the libgomp torch has loaded, i.e. torch's thread pool) and
builds without it where the compiler has none. None where it cannot run: not x86-64 with
AVX2 / FMA, no C compiler, ARKINFER_NATIVE=0, or a failed build (warned once by the caller).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ["-O3", "-fPIC", "-shared", "-std=c99", "-mavx2", "-mfma", "-mf16c"]


class NativeBuildError(RuntimeError):
    """The compiler failed on every flag set tried (the message holds the last error)."""


def available() -> bool:
    """x86-64 with AVX2 (what FLAGS target), a C compiler, and ARKINFER_NATIVE not 0."""
    import torch

    return (os.environ.get("ARKINFER_NATIVE", "1") != "0"
            and platform.machine() in ("x86_64", "AMD64")
            and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
            and compiler() is not None)


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def load_library(name: str, sources: list[Path], flags: list[str] = FLAGS,
                 openmp: bool = False) -> ctypes.CDLL | None:
    """The compiled `sources` (the first one is compiled; the others are headers it includes,
    hashed too) as a ctypes library; None when `available()` is false. Raises NativeBuildError
    when the compiler fails."""
    if not available() or not all(p.is_file() for p in sources):
        return None
    cc = compiler()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "arkinfer" / \
        "kernels"
    failure: Exception | None = None
    for extra in ((["-fopenmp"], []) if openmp else ([],)):
        all_flags = [*flags, *extra]
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)
                                + " ".join([cc, *all_flags]).encode()).hexdigest()[:16]
        lib_path = cache / f"{name}_{digest}.so"
        try:
            if not lib_path.exists():
                cache.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryDirectory(dir=cache) as tmp:
                    built = Path(tmp) / lib_path.name
                    subprocess.run([cc, *all_flags, f"-I{sources[0].parent}", str(sources[0]),
                                    "-o", str(built), "-lm"], check=True, capture_output=True,
                                   timeout=120)
                    os.replace(built, lib_path)
            return ctypes.CDLL(str(lib_path))
        except (OSError, subprocess.SubprocessError) as exc:
            failure = exc
    raise NativeBuildError(f"building {name} failed: {failure}")
