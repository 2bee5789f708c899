"""Compile the CUDA kernels with nvcc: object files for the CI compile check, and the shared
library `libarkinfer_kernels.so` for ctypes, built on first use into ~/.cache/arkinfer/kernels
(file name keyed by the sources and flags; written atomically). CMakeLists.txt is the device build
for plugins; this module is the same compile for tests and benchmarks."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["ARCHS", "SOURCES", "compile_objects", "gencode_flags", "library_path", "nvcc"]

HERE = Path(__file__).parent
SOURCES = ("w4a16_marlin.cu", "infllmv2.cu")
HEADERS = ("arkinfer_kernels.h", "marlin_layout.cuh")
ARCHS = (87, 90)   # Jetson Orin, H100/H200


def nvcc() -> str | None:
    """Path of nvcc ($NVCC, PATH, /usr/local/cuda/bin, /usr/local/bin), or None."""
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc",
                 "/usr/local/bin/nvcc"):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def gencode_flags(archs: tuple[int, ...] = ARCHS) -> list[str]:
    """`-gencode arch=compute_XX,code=sm_XX` per architecture (SASS for each, no PTX)."""
    return [f for a in archs for f in ("-gencode", f"arch=compute_{a},code=sm_{a}")]


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr}")


def compile_objects(source: str, out_dir: Path, archs: tuple[int, ...] = ARCHS,
                    opt: str = "-O2") -> Path:
    """nvcc -c one source for every arch in one call -> the .o path; RuntimeError with nvcc's
    stderr on failure, FileNotFoundError when nvcc is absent."""
    exe = nvcc()
    if exe is None:
        raise FileNotFoundError("nvcc not found (set $NVCC or put it on PATH)")
    out = Path(out_dir) / (Path(source).stem + ".o")
    _run([exe, opt, "-std=c++17", *gencode_flags(archs), "-c", str(HERE / source), "-o", str(out)])
    return out


def _arch_of_device() -> tuple[int, ...]:
    try:
        import torch
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return (10 * major + minor,)
    except ImportError:
        pass
    return ARCHS


def library_path(archs: tuple[int, ...] | None = None) -> Path:
    """Build (once) and return libarkinfer_kernels.so for `archs` (default: the visible GPU's, or
    ARCHS). Cached under $ARKINFER_CACHE or ~/.cache/arkinfer/kernels."""
    archs = archs or _arch_of_device()
    exe = nvcc()
    if exe is None:
        raise FileNotFoundError("nvcc not found (set $NVCC or put it on PATH)")
    flags = ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", *gencode_flags(archs)]
    digest = hashlib.sha256(" ".join(flags).encode())
    for name in SOURCES + HEADERS:
        digest.update((HERE / name).read_bytes())
    root = Path(os.environ.get("ARKINFER_CACHE", Path.home() / ".cache" / "arkinfer")) / "kernels"
    target = root / f"libarkinfer_kernels-{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        tmp_lib = Path(tmp) / target.name
        _run([exe, *flags, *(str(HERE / s) for s in SOURCES), "-o", str(tmp_lib)])
        os.replace(tmp_lib, target)
    return target
