"""What machine a build, benchmark or bench result ran on (recorded beside every number)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from arkinfer.huge_pages import status


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


#: The CPU flags a speed depends on (kernels dispatch on them), in the order they are reported:
#: x86 vector widths and dot-product / matrix extensions, and Arm's SIMD ones.
SIMD_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
              "asimd", "asimddp", "sve", "i8mm", "bf16")


def cpu_features(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """The SIMD_FLAGS the first CPU of `cpuinfo` lists (x86 `flags`, Arm `Features`); [] when
    the file cannot be read (not Linux)."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            present = set(value.split())
            return [f for f in SIMD_FLAGS if f in present]
    return []


def machine_info(**extra: object) -> dict[str, object]:
    """cpu, its SIMD features (`cpu_features`), cores, python and torch versions, whether malloc
    asks for huge pages (arkinfer/huge_pages.py), plus any `extra` fields (e.g. threads)."""
    import torch

    return {"cpu": cpu_model(), "cpu_features": cpu_features(), "cores": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__,
            "huge_page_malloc": status()["on"], **extra}
