"""What a build will cost before it starts — calibration time and peak memory, disk — and what
it did cost, side by side in the manifest.

    predicted = predict_build(raw_config, recipe, samples=128, seq_len=512)  # or "f16"
    predicted["calibration"]["seconds"], predicted["disk_bytes"]
    predict_build(raw_config, recipe, 128, 2048, gpu="h100")["calibration_gpu"]  # on a named GPU

    cost = calibration_cost(raw_config, recipe, "auto", samples, seq_len)   # in build
    check_calibration_memory(cost, "auto")  # refuses, with the numbers, what cannot fit
    with measure_stage() as measured:      # seconds and this process's peak resident set
        calibrate(...)
    cost["measured"] = measured            # the manifest's quant.calibration_cost

The calibration figures are `quant.calib.cost.predict_calibration` (GPTQ / P-GPTQ on this
machine's CPU, its fp32 matmul rate measured by `arkinfer doctor`; or, with `--device cuda` or
`plan --gpu NAME`, on a GPU of `quant.calib.gpus.GPUS`, `predict_calibration_on_gpu`); other
calibrations (AWQ) are not predicted and say so, weight-only recipes calibrate nothing. Disk:
`build_disk_bytes`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .disk_space import build_disk_bytes

PREDICTED_METHODS = ("gptq", "pgptq")


def host_matmul_rate(measure_if_missing: bool) -> float | None:
    """This machine's fp32 matmul FLOP/s as `arkinfer doctor` measured (and cached) it; None
    when not measured yet and `measure_if_missing` is False."""
    from arkinfer.targets.host import host_measurement

    record = host_measurement(measure_if_missing=measure_if_missing)
    return None if record is None else float(record["matmul_fp32_flop_s"])


def predict_calibration_of(raw_config: dict[str, Any], recipe: Any, samples: int,
                           seq_len: int, *, measure_if_missing: bool = False,
                           in_this_process: bool = False, gpu: Any = None) -> dict[str, Any]:
    """{"predicted": bool, "why": text} plus, when predicted, `CalibrationCost.as_dict()`.
    `in_this_process`: the calibration runs here (build), so its peak starts from this process's
    resident set instead of a fresh process's. `gpu` (a `gpus.GpuSpec`): on that GPU instead,
    with its `gpu` label and `gpu_memory_bytes` added."""
    from arkinfer.quant.calib.weight_only import is_weight_only

    if recipe is None or is_weight_only(recipe):
        return {"predicted": False, "why": "no calibration (weight-only recipe)"}
    if getattr(recipe, "budget", None) is not None:
        return {"predicted": False, "why": "mixed precision's sensitivity stage is not modelled"}
    if recipe.calib not in PREDICTED_METHODS:
        return {"predicted": False,
                "why": f"{recipe.calib} calibration time is not modelled (GPTQ and P-GPTQ are)"}
    from arkinfer.quant.recipe import static_passes_for

    if gpu is not None:
        from arkinfer.quant.calib.cost import predict_calibration_on_gpu

        cost = predict_calibration_on_gpu(raw_config, recipe, samples, seq_len, gpu,
                                          static_passes=static_passes_for(recipe.format))
        return {"predicted": True, "gpu": gpu.label, "gpu_memory_bytes": gpu.memory_bytes,
                **cost.as_dict()}
    rate = host_matmul_rate(measure_if_missing)
    if rate is None:
        return {"predicted": False,
                "why": "this machine's matmul rate is not measured: run `arkinfer doctor`"}
    import torch

    from arkinfer.quant.calib.cost import predict_calibration

    cost = predict_calibration(raw_config, recipe, samples, seq_len, rate,
                               threads=torch.get_num_threads(),
                               static_passes=static_passes_for(recipe.format),
                               process_bytes=_status_bytes("VmRSS:") if in_this_process
                               else None)
    return {"predicted": True, **cost.as_dict()}


def predict_build(raw_config: dict[str, Any], quant: Any, samples: int, seq_len: int, *,
                  measure_if_missing: bool = False, gpu: str | None = None) -> dict[str, Any]:
    """The calibration prediction and the disk the build may write (module docstring); `quant`
    is the QuantRecipe, or the float scheme's name (e.g. "f16"). `gpu`: a name of
    `quant.calib.gpus.GPUS`, adding `calibration_gpu`, the calibration on that GPU."""
    from arkinfer.quant.calib.gpus import find_gpu
    from arkinfer.quant.calib.weight_only import is_weight_only

    recipe = None if isinstance(quant, str) else quant
    spec = None if gpu is None else find_gpu(gpu)
    calib = predict_calibration_of(raw_config, recipe, samples, seq_len,
                                   measure_if_missing=measure_if_missing)
    tokens = 0 if recipe is None or is_weight_only(recipe) else samples * seq_len
    out = {"calibration": calib, "disk_bytes": build_disk_bytes(raw_config, quant, tokens)}
    if spec is not None:
        out["calibration_gpu"] = predict_calibration_of(raw_config, recipe, samples, seq_len,
                                                        gpu=spec)
    return out


#: The calibration is refused before it starts when even this fraction of its predicted peak
#: memory is more than the machine has available (the prediction is checked to within +-30 %).
MEMORY_LOWER_BOUND = 0.7


def calibration_cost(raw_config: dict[str, Any], recipe: Any, device: str, samples: int,
                     seq_len: int) -> dict[str, Any]:
    """The manifest's `quant.calibration_cost` before the calibration: {"predicted": {seconds,
    peak_bytes, flops, matmul_flop_s, device}} (what `plan` prints; on the CPU the peak starts
    from this process's resident set, on a GPU it is GPU memory), or {"predicted": None, "why":
    ...}; `build` adds "measured"."""
    from arkinfer.quant.calib.device import describe, resolve_device
    from arkinfer.quant.calib.gpus import gpu_of_device_name

    dev = resolve_device(device)
    gpu = None
    if dev.type == "cuda":
        import torch

        name = torch.cuda.get_device_name(dev)
        gpu = gpu_of_device_name(name)
        if gpu is None:
            return {"predicted": None, "why": f"{name} is not among the GPUs calibration is "
                    "predicted for (arkinfer/quant/calib/gpus.py)"}
    p = predict_calibration_of(raw_config, recipe, samples, seq_len, measure_if_missing=True,
                               in_this_process=True, gpu=gpu)
    if not p["predicted"]:
        return {"predicted": None, "why": p["why"]}
    return {"predicted": {"seconds": p["seconds"], "peak_bytes": p["peak_bytes"],
                          "flops": p["flops"], "matmul_flop_s": p["matmul_flop_s"],
                          "device": describe(dev)}}


def check_calibration_memory(cost: dict[str, Any], device: str = "cpu") -> None:
    """CheckpointError with the numbers when the predicted calibration cannot fit in memory: the
    machine's available memory, or the free memory of the GPU `device` resolves to."""
    p = cost.get("predicted")
    if p is None:
        return
    from arkinfer.quant.calib.device import resolve_device

    dev = resolve_device(device)
    if dev.type == "cuda":
        _check_gpu_memory(p, dev)
        return
    from arkinfer.frontend.checkpoint import check_memory

    check_memory(int(MEMORY_LOWER_BOUND * p["peak_bytes"]),
                 f"calibration (predicted peak {p['peak_bytes'] / 2**30:.2f} GiB, at least "
                 f"{MEMORY_LOWER_BOUND:.0%} of it)",
                 hint="use a machine with more RAM, fewer --samples or a shorter --seq-len, "
                      "or --device cuda")


def _check_gpu_memory(p: dict[str, Any], dev: Any) -> None:
    import torch

    from arkinfer.errors import CheckpointError

    free, _total = torch.cuda.mem_get_info(dev)
    need = int(MEMORY_LOWER_BOUND * p["peak_bytes"])
    if need > free:
        raise CheckpointError(
            f"calibration on {p['device']} (predicted peak {p['peak_bytes'] / 2**30:.2f} GiB of "
            f"GPU memory, at least {MEMORY_LOWER_BOUND:.0%} of it) needs {need / 2**30:.2f} GiB "
            f"but the GPU has {free / 2**30:.2f} GiB free",
            hint="free the GPU, use fewer --samples or a shorter --seq-len, or --device cpu")


def cost_line(cost: dict[str, Any]) -> str:
    """One line: the calibration's measured seconds and peak memory (GPU memory on a GPU)
    beside the prediction."""
    m, p = cost["measured"], cost["predicted"]
    gpu = m.get("peak_gpu_bytes")
    peak = gpu or m["peak_rss_bytes"]
    text = f"calibration took {m['seconds']:.0f} s" + (
        f", peak {'GPU ' if gpu else ''}memory {peak / 2**30:.2f} GiB" if peak else "")
    if p is None:
        return text + f" (not predicted: {cost['why']})"
    return text + f" (plan predicted {p['seconds']:.0f} s, {p['peak_bytes'] / 2**30:.2f} GiB)"


def _status_bytes(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    """Reset this process's peak resident set to the current one (Linux: clear_refs 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@contextmanager
def measure_stage() -> Iterator[dict[str, Any]]:
    """Fills the yielded dict with the body's wall seconds and the process's peak resident set
    during it (`peak_rss_bytes`; None where /proc has no peak to reset and read)."""
    out: dict[str, Any] = {}
    reset = _reset_peak()
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        out["seconds"] = round(time.perf_counter() - t0, 1)
        out["peak_rss_bytes"] = _status_bytes("VmHWM:") if reset else None
