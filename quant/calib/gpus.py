"""Named GPUs a calibration can be predicted for (`arkinfer plan --gpu NAME`).

    gpu = find_gpu("h100")              # GpuSpec; QuantError naming the known ones otherwise
    gpu = gpu_of_device_name("NVIDIA H100 80GB HBM3")   # the local GPU, or None when unknown

Calibration runs in true float32 (TF32 off, `device.exact_float32`), so the rate that matters is
the GPU's float32 rate without tensor cores: vendor datasheet figures (boost clock, dense).
Jetson's is derived (2048 CUDA cores x 2 FLOPs x 1.3 GHz) and its memory is shared with the CPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..weight import QuantError


@dataclass(frozen=True)
class GpuSpec:
    """A GPU: `name` (what --gpu takes), `label` (what reports say), float32 FLOP/s without tensor
    cores, memory bytes, and the substrings of torch.cuda.get_device_name that identify it."""

    name: str
    label: str
    fp32_flop_s: float
    memory_bytes: int
    device_names: tuple[str, ...]


GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    GpuSpec("h200", "NVIDIA H200", 67e12, 141 * 10**9, ("H200",)),
    GpuSpec("h100", "NVIDIA H100 SXM", 67e12, 80 * 10**9, ("H100 80GB HBM3", "H100 SXM")),
    GpuSpec("h100-pcie", "NVIDIA H100 PCIe", 51e12, 80 * 10**9, ("H100 PCIe",)),
    GpuSpec("a100", "NVIDIA A100 80GB", 19.5e12, 80 * 10**9, ("A100",)),
    GpuSpec("l40s", "NVIDIA L40S", 91.6e12, 48 * 10**9, ("L40S",)),
    GpuSpec("l4", "NVIDIA L4", 30.3e12, 24 * 10**9, ("L4",)),
    GpuSpec("rtx-4090", "NVIDIA GeForce RTX 4090", 82.6e12, 24 * 10**9, ("RTX 4090",)),
    GpuSpec("jetson-orin", "NVIDIA Jetson AGX Orin 64GB", 5.3e12, 64 * 10**9, ("Orin",)),
)}


def find_gpu(name: str) -> GpuSpec:
    """The GpuSpec called `name` (case-insensitive); QuantError listing the known ones."""
    key = name.strip().lower()
    if key not in GPUS:
        raise QuantError(f"--gpu {name!r} is not a GPU ArkInfer can predict for",
                         f"use one of: {', '.join(GPUS)}")
    return GPUS[key]


def gpu_of_device_name(device_name: str) -> GpuSpec | None:
    """The GpuSpec one of whose identifying words is in `device_name` (torch's name of the local
    GPU; whole words, so "L4" does not match "L40S"), None when none is."""
    for gpu in GPUS.values():
        if any(re.search(rf"\b{re.escape(part)}\b", device_name) for part in gpu.device_names):
            return gpu
    return None
