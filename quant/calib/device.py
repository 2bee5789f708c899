"""Where calibration runs: `--device auto|cpu|cuda[:N]` resolved to one torch device.

    device = resolve_device("auto")     # cuda:0 when torch sees a CUDA GPU, else cpu
    device = resolve_device("cuda")     # QuantError (with what to do) when it sees none

On CUDA the streaming calibration (stream.py) keeps one decoder block, its calibration activations
and its Hessians on the GPU: block weights go up as they are read from the memory-mapped
checkpoint, quantised codes come back to the CPU as each block is written. The algorithms are the
same code on either device; float32 matmuls stay true float32 (TF32 is switched off while
calibrating), so CPU and GPU codes differ only where a value sits within float32 rounding of a
rounding boundary (tests/quant_calib/test_calib_device.py states the tolerance).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from ..weight import QuantError

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(choice: str | torch.device | None = "auto") -> torch.device:
    """The torch device for `choice`: "auto" (CUDA when available, else CPU), "cpu", "cuda" or
    "cuda:N". Raises QuantError for an unknown name or a CUDA device torch cannot see."""
    if isinstance(choice, torch.device):
        choice = str(choice)
    text = (choice or "auto").strip().lower()
    if text == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "cuda" or text.startswith("cuda:"):
        index = 0
        if text != "cuda":
            try:
                index = int(text.split(":", 1)[1])
            except ValueError:
                raise QuantError(f"--device {choice!r} is not a device",
                                 "use auto, cpu, cuda or cuda:N with N a GPU index") from None
        if not torch.cuda.is_available():
            built = torch.version.cuda or "none (a CPU-only build)"
            raise QuantError(f"--device {choice}: torch {torch.__version__} sees no CUDA GPU "
                             f"(its CUDA version: {built})",
                             "use --device cpu (or auto, which picks the CPU here); for a GPU "
                             "install a CUDA build of torch and check `nvidia-smi`")
        count = torch.cuda.device_count()
        if index >= count:
            raise QuantError(f"--device {choice}: torch sees {count} CUDA GPU(s), numbered "
                             f"0..{count - 1}", f"use cuda:0 .. cuda:{count - 1}")
        return torch.device("cuda", index)
    raise QuantError(f"--device {choice!r} is not one of {', '.join(DEVICE_CHOICES)}",
                     "use auto (a CUDA GPU when there is one), cpu, cuda or cuda:N")


def describe(device: torch.device) -> str:
    """"cpu" or "cuda:0 (NVIDIA H100 80GB HBM3)" for reports and manifests."""
    if device.type != "cuda":
        return str(device)
    return f"{device} ({torch.cuda.get_device_name(device)})"


@contextmanager
def exact_float32(device: torch.device):
    """Run the body with TF32 off on CUDA (float32 matmuls and convolutions in full float32),
    restoring the caller's settings afterwards; a no-op on the CPU."""
    if device.type != "cuda":
        yield
        return
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def peak_bytes(device: torch.device) -> int | None:
    """The device's peak allocated bytes since the last `reset_peak` (None on the CPU)."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
