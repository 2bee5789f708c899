"""Layer streaming: calibrate a checkpoint one decoder block at a time, resumable.

    run = calibrate("./model", recipe, calib, work_dir="./out.work", progress=cb)
    # then quant.export.export_folder(run, "./out") writes the quantised HF folder

1. the embedding of the calibration ids gives block 0's inputs [N, T, H] (float32);
2. for each block i: its tensors are read from the memory-mapped checkpoint (`LazyWeights`) into
   a block built on the meta device; the handler quantises it (true-sequential inside the
   block); the quantised block runs on the inputs to give block i+1's inputs;
3. after a block, `block_XXXX.safetensors` (canonical codes/scales/zeros/g_idx of every
   quantised linear, changed float tensors, the block's report) and `hidden.safetensors` (the
   next block's inputs, fp32 bit-exact) are written to the work dir (temp name + rename), then
   `progress(i, n_layers, seconds)` is called. The inputs are rewritten after every block while
   that is cheap; once writing them takes a second or more (an 8B model at 128 x 2048 tokens:
   4.3 GB, ~10 s with its sha256) only after HIDDEN_SAVE_RATIO times that much block work and
   after the last block, so checkpointing stays under ~10 % of the run and a resume redoes at
   most that much work;
4. with `resume=True` a work dir whose `run.json` key matches (source, config, recipe, options,
   calibration hash, batch) continues after the last block whose inputs were saved; the result
   is identical to an uninterrupted run (same ops in the same order on the same inputs). Every
   work file gets a `<name>.sha256` sidecar when it is written, and resume checks the files it
   reuses against them: a changed or corrupted file is an error, never silently used;
5. `lm_head` (only when the recipe does not skip it) is quantised last from the final normed
   hidden states.

Peak memory: one float32 block + its Hessians + calibration activations (a few [N, T, H]
tensors), never the model. With `device="cuda"` (quant/calib/device.py) those live on the GPU and
each block's report records the GPU's peak allocated bytes (`gpu_peak_bytes`); the host holds the
calibration ids, one block's inputs while they are written, and the codes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from arkinfer import models
from arkinfer.errors import CheckpointError
from arkinfer.frontend.checkpoint import Checkpoint, check_weights, open_checkpoint
from arkinfer.output_folder import fresh_work_folder

from ..calib_data import CalibData
from ..recipe import QuantRecipe
from ..weight import Kind, QuantError, QuantizedWeight
from .base import CalibContext, block_snr_db, context_for, hessian_snr_db, trim_heap
from .block import LINEARS, BlockRunner, default_batch
from .device import describe, exact_float32, peak_bytes, reset_peak, resolve_device
from .hessian import CrossAccumulator, HessianAccumulator
from .registry import config_as_dict, config_for, handler_for

ProgressFn = Callable[[int, int, float], None]
WORK_VERSION = 1
HIDDEN_SAVE_MIN_SECONDS = 1.0  # inputs that take less to write are written after every block
HIDDEN_SAVE_RATIO = 10.0  # else after this many times their writing time of block work


@dataclass
class CalibrationRun:
    """The outcome of `calibrate`: everything export needs (tensors stay in `work_dir`)."""

    source: Path
    work_dir: Path
    recipe: QuantRecipe
    config: dict
    calib: dict
    n_layers: int
    blocks: list[dict] = field(default_factory=list)
    tail: dict | None = None
    seconds: float = 0.0
    device: str = "cpu"


# ----------------------------------------------------------------------------- serialisation
def save_weights(path: Path, quantized: dict[str, QuantizedWeight], floats: dict[str, Tensor],
                 info: dict) -> None:
    """Canonical weights + float tensors + a JSON report in one safetensors file (atomic)."""
    tensors: dict[str, Tensor] = {}
    meta: dict[str, Any] = {"linears": {}, "floats": sorted(floats), "info": info}
    for name, qw in quantized.items():
        qw = qw.to("cpu")
        tensors[f"{name}.codes"] = qw.codes
        tensors[f"{name}.scales"] = qw.scales
        tensors[f"{name}.zeros"] = qw.zeros
        if qw.g_idx is not None:
            tensors[f"{name}.g_idx"] = qw.g_idx
        if qw.mins is not None:
            tensors[f"{name}.mins"] = qw.mins
        if qw.levels is not None:
            tensors[f"{name}.levels"] = qw.levels.clone()  # safetensors refuses shared memory
        meta["linears"][name] = {"bits": qw.bits, "group_size": qw.group_size, "sym": qw.sym,
                                 "kind": str(qw.kind)}
    for name, t in floats.items():
        tensors[name] = t.detach().float().cpu().contiguous()
    _atomic_save(path, tensors, {"json": json.dumps(meta, sort_keys=True)})


def load_weights(path: Path) -> tuple[dict[str, QuantizedWeight], dict[str, Tensor], dict]:
    """Inverse of save_weights -> (quantized, floats, info)."""
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["json"])
        keys = set(f.keys())
        quantized = {}
        for name, m in meta["linears"].items():
            g_idx = f.get_tensor(f"{name}.g_idx") if f"{name}.g_idx" in keys else None
            quantized[name] = QuantizedWeight(
                f.get_tensor(f"{name}.codes"), f.get_tensor(f"{name}.scales"),
                f.get_tensor(f"{name}.zeros"), m["bits"], m["group_size"], m["sym"], g_idx,
                Kind(m["kind"]), name,
                mins=f.get_tensor(f"{name}.mins") if f"{name}.mins" in keys else None,
                levels=f.get_tensor(f"{name}.levels") if f"{name}.levels" in keys else None)
        floats = {n: f.get_tensor(n) for n in meta["floats"]}
    return quantized, floats, meta["info"]


def load_info(path: Path) -> dict:
    """Only the JSON report of a save_weights file (no tensor is read)."""
    with safe_open(str(path), framework="pt") as f:
        return json.loads(f.metadata()["json"])["info"]


def _atomic_save(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
    """Write `path` (temp name + rename) and its sha256 sidecar. A crash between the two leaves a
    sidecar that does not match, which resume reports instead of using the file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    save_file(tensors, str(tmp), metadata=metadata)
    digest = _sha256(tmp)
    os.replace(tmp, path)
    sidecar = _sidecar(path)
    tmp = sidecar.with_name(f".{sidecar.name}.{os.getpid()}.part")
    tmp.write_text(digest + "\n")
    os.replace(tmp, sidecar)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_work_file(path: Path) -> None:
    """Raise QuantError unless `path` matches the sha256 recorded in its sidecar when written."""
    sidecar = _sidecar(path)
    recorded = sidecar.read_text().strip() if sidecar.is_file() else None
    if recorded is None or recorded != _sha256(path):
        why = ("has no recorded sha256" if recorded is None else
               "does not match the sha256 recorded when it was written (changed or corrupted)")
        raise QuantError(f"work file {path} {why}; --resume does not use it and stops here",
                         f"rerun without --resume to recompute every block (the work folder "
                         f"{path.parent} is then rewritten)")


def block_file(work_dir: Path, i: int) -> Path:
    return work_dir / f"block_{i:04d}.safetensors"


# --------------------------------------------------------------------------------- helpers
def load_block(model: nn.Module, ckpt: Checkpoint, i: int,
               device: torch.device | str = "cpu") -> nn.Module:
    """Decoder block i with float32 copies of its tensors on `device` (the rest of the model
    stays meta)."""
    layer = model.model.layers[i]
    prefix = f"model.layers.{i}."
    state = {n: ckpt.weights.get(prefix + n).to(device, torch.float32, copy=True)
             for n in layer.state_dict()}
    layer.load_state_dict(state, strict=True, assign=True)
    for p in layer.parameters():
        p.requires_grad_(False)
    return layer


def release_maps(ckpt: Checkpoint) -> None:
    """Close LazyWeights' cached safetensors handles, unmapping the files: pages a block touched
    would otherwise stay mapped and count in this process's RSS until the whole model is."""
    handles = getattr(ckpt.weights, "_handles", None)
    if isinstance(handles, dict):
        handles.clear()


def _run_key(ckpt: Checkpoint, recipe: QuantRecipe, config: dict, calib: CalibData,
             batch: int, device: torch.device) -> str:
    """What a resumable run is: the device type is part of it (CPU and GPU codes may differ
    in float32 rounding, so a run is only resumed on the kind of device it started on)."""
    files = sorted({(i.file.name, i.file.stat().st_size) for i in ckpt.weights.infos.values()})
    payload = {"version": WORK_VERSION, "source": str(ckpt.path.resolve()), "files": files,
               "config": ckpt.raw_config, "recipe": dataclasses.asdict(recipe), "calib_config":
               config, "calib": calib.sha256, "batch": batch}
    if device.type != "cpu":
        payload["device"] = device.type
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _start_point(work_dir: Path, key: str, resume: bool, n_layers: int
                 ) -> tuple[int, Tensor | None, Tensor | None]:
    """(first block to process, its inputs or None = start from the embedding, the float
    model's inputs to it when the run carries them)."""
    run_json, hidden = work_dir / "run.json", work_dir / "hidden.safetensors"
    if resume and run_json.is_file():
        stored = json.loads(run_json.read_text())
        if stored.get("key") != key:
            raise QuantError(f"work dir {work_dir} holds a run with different settings (source, "
                             "recipe, options or calibration data)",
                             f"rerun without --resume to start over, or delete {work_dir}")
        if hidden.is_file():
            check_work_file(hidden)
            with safe_open(str(hidden), framework="pt") as f:
                after = int(f.metadata()["after_block"])
                x = f.get_tensor("hidden")
                x_float = f.get_tensor("hidden_float") if "hidden_float" in set(f.keys()) else None
            missing = [i for i in range(after + 1) if not block_file(work_dir, i).is_file()]
            if not missing:
                for i in range(after + 1):
                    check_work_file(block_file(work_dir, i))
                return after + 1, x, x_float
        return 0, None, None
    fresh_work_folder(work_dir)
    run_json.write_text(json.dumps({"key": key, "n_layers": n_layers}) + "\n")
    return 0, None, None


def open_float_source(source: str | Path | Checkpoint) -> tuple[Checkpoint, nn.Module]:
    """The float checkpoint to calibrate (refused when already quantised, or when it lacks a
    tensor the model needs) and its model skeleton on the meta device (blocks load one by one)."""
    ckpt = source if isinstance(source, Checkpoint) else open_checkpoint(source, with_tokenizer=False)
    check_source(ckpt)
    with torch.device("meta"):
        model = models.build_model(ckpt.config)
    check_weights(models.module_for(ckpt.raw_config).expected_weights(model), ckpt.weights,
                  ckpt.path)
    return ckpt, model


def _skip_set(recipe: QuantRecipe, n_layers: int) -> frozenset[str]:
    return frozenset(f"model.layers.{i}.{n}" for i in range(n_layers) for n in LINEARS
                     if recipe.skips(f"model.layers.{i}.{n}"))


# ------------------------------------------------------------------------------------ main
@torch.no_grad()
def calibrate(source: str | Path | Checkpoint, recipe: QuantRecipe, calib: CalibData,
              work_dir: str | Path, *, options: dict[str, Any] | None = None,
              resume: bool = False, strict: bool = False, batch: int | None = None,
              progress: ProgressFn | None = None,
              device: str | torch.device = "cpu") -> CalibrationRun:
    """Quantise every decoder block of `source` with `recipe` on `calib`, streaming.

    options: extra fields of the algorithm's config (e.g. {"damp": 0.05, "static_groups": True}).
    strict: a linear the format cannot take raises StrictError (else it stays float, reported).
    batch: sequences per forward (default: about 4096 tokens).
    device: where blocks, activations and Hessians live ("auto", "cpu", "cuda", "cuda:N";
    device.py); the saved work files and the result are the same format on either.
    """
    t_start = time.perf_counter()
    dev = resolve_device(device)
    with exact_float32(dev):
        return _calibrate(source, recipe, calib, Path(work_dir), options, resume, strict, batch,
                          progress, dev, t_start)


def _calibrate(source: str | Path | Checkpoint, recipe: QuantRecipe, calib: CalibData,
               work_dir: Path, options: dict[str, Any] | None, resume: bool, strict: bool,
               batch: int | None, progress: ProgressFn | None, dev: torch.device,
               t_start: float) -> CalibrationRun:
    ckpt, model = open_float_source(source)
    cfg = ckpt.config
    if recipe.budget is not None:  # mixed precision: choose every tensor's format first
        from ..mix import resolve_budget

        recipe = resolve_budget(recipe, ckpt, calib.ids,
                                log=lambda m: print(m, file=sys.stderr, flush=True),
                                domains=len(calib.settings.get("domains") or ()) or 1)
    config = config_for(recipe, **(options or {}))
    handler = handler_for(config)
    n_layers = cfg.num_hidden_layers
    ctx = context_for(recipe, _skip_set(recipe, n_layers), strict)
    seq_len = calib.seq_len
    batch = batch or default_batch(seq_len)
    key = _run_key(ckpt, recipe, config_as_dict(config), calib, batch, dev)
    carry_float = bool(getattr(config, "asymmetric", False))  # GPTQ asymmetric: both paths
    start, x, x_float = _start_point(work_dir, key, resume, n_layers)
    mask = calib.mask.to(dev)
    if x is None:
        emb = ckpt.weights.get("model.embed_tokens.weight")
        x = nn.functional.embedding(calib.ids, emb).float() * cfg.embedding_scale
        del emb
        release_maps(ckpt)
        x_float = x.clone() if carry_float else None
    x = x.to(dev)
    x_float = None if x_float is None else x_float.to(dev)
    inv_freq, rope_scale = cfg.inv_freq(seq_len)
    rope = (inv_freq.to(dev), rope_scale)
    save_cost = since_save = 0.0
    for i in range(start, n_layers):
        t0 = time.perf_counter()
        reset_peak(dev)
        layer = load_block(model, ckpt, i, dev)
        release_maps(ckpt)
        runner = BlockRunner(layer, f"model.layers.{i}.", x, mask, rope, batch)
        runner.float_inputs = x_float
        if not handler.records_reference:
            runner.ensure_reference()
        result = handler.quantize_block(runner, ctx)
        if runner.reference is None:
            raise RuntimeError(f"handler {handler.name} did not run the float block first")
        y = result.outputs if result.outputs is not None else runner.run()
        y_float = result.float_outputs  # None unless the run carries the float model's path
        info = {"block": i, "seconds": round(time.perf_counter() - t0, 3),
                "block_snr_db": _round(block_snr_db(runner.reference, x, y, mask)),
                "linears": [r.as_dict() for r in result.reports]}
        if dev.type == "cuda":
            info["gpu_peak_bytes"] = peak_bytes(dev)
        save_weights(block_file(work_dir, i), result.quantized, result.floats, info)
        since_save += time.perf_counter() - t0
        if (i == n_layers - 1 or save_cost < HIDDEN_SAVE_MIN_SECONDS
                or since_save >= HIDDEN_SAVE_RATIO * save_cost):
            t_save = time.perf_counter()
            hidden = {"hidden": y.cpu().contiguous()}
            if y_float is not None:
                hidden["hidden_float"] = y_float.cpu().contiguous()
            _atomic_save(work_dir / "hidden.safetensors", hidden, {"after_block": str(i)})
            save_cost, since_save = time.perf_counter() - t_save, 0.0
        model.model.layers[i] = layer.to("meta")
        del runner, layer, result
        trim_heap()
        x, x_float = y, y_float
        if progress is not None:
            progress(i, n_layers, info["seconds"])
    blocks = [load_info(block_file(work_dir, i)) for i in range(n_layers)]
    tail = _tail(ckpt, recipe, handler, ctx, x, mask, work_dir, x_float)
    return CalibrationRun(ckpt.path, work_dir, recipe, config_as_dict(config),
                          calib.describe(), n_layers, blocks, tail,
                          round(time.perf_counter() - t_start, 3), describe(dev))


def _tail(ckpt: Checkpoint, recipe: QuantRecipe, handler, ctx: CalibContext, x: Tensor,
          mask: Tensor, work_dir: Path, x_float: Tensor | None = None) -> dict | None:
    """Quantise lm_head unless the recipe skips it (inputs: final norm of the last hidden).
    With `x_float` (the float model's last hidden, asymmetric GPTQ) an untied lm_head aims at
    the float model's logits; a tied one stays aimed at its own weights, which the embedding
    lookup reads too."""
    path = work_dir / "tail.safetensors"
    if recipe.skips("lm_head"):
        path.unlink(missing_ok=True)
        return None
    cfg = ckpt.config
    w = tail_weight(ckpt).to(x.device)
    norm_w = ckpt.weights.get("model.norm.weight").float().to(x.device)
    release_maps(ckpt)
    h = torch.ops.arkinfer.rms_norm(x, norm_w, cfg.rms_norm_eps) / cfg.logit_divisor
    acc = HessianAccumulator(w.shape[1], "lm_head", device=x.device)
    acc.add(h, mask)
    cross = None
    if x_float is not None and not cfg.tie_word_embeddings and acc.count:
        h_float = torch.ops.arkinfer.rms_norm(x_float, norm_w, cfg.rms_norm_eps) / cfg.logit_divisor
        moments = CrossAccumulator(w.shape[1], "lm_head", device=x.device)
        moments.add(h_float, h, mask)
        cross = moments.matrix()
    return save_tail(path, handler, ctx, w, acc.hessian() if acc.count else None, cross)


def tail_weight(ckpt: Checkpoint) -> Tensor:
    """lm_head's float32 weight (the embedding when they are tied)."""
    tied = ckpt.config.tie_word_embeddings
    w = ckpt.weights.get("model.embed_tokens.weight" if tied else "lm_head.weight")
    return w.to(torch.float32, copy=True)


def save_tail(path: Path, handler, ctx: CalibContext, w: Tensor, hess: Tensor | None,
              cross: Tensor | None = None) -> dict:
    """Quantise lm_head (`hess`: its input Hessian, None without tokens; `cross`: the float /
    quantised cross moments of asymmetric GPTQ), check it against the format and write `path`;
    returns the tail's report."""
    t0 = time.perf_counter()
    qw = handler.quantize_tail("lm_head", w, hess, ctx, cross)
    info: dict[str, Any] = {"name": "lm_head", "recipe": handler.describe()}
    why = ctx.refusal(qw, "lm_head")
    if why is not None:
        info.update(status="refused", reason=why)
        save_weights(path, {}, {}, info)
        return info
    info.update(status="quantised", seconds=round(time.perf_counter() - t0, 3),
                snr_db=_round(hessian_snr_db(w, qw.to(w.device).dequantize(), hess)
                              if hess is not None else None))
    save_weights(path, {"lm_head": qw}, {}, info)
    return info


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def check_source(ckpt: Checkpoint) -> None:
    """Raise when the checkpoint is already quantised (calibration needs float weights)."""
    if "quantization_config" in ckpt.raw_config:
        raise CheckpointError(f"{ckpt.path} is already quantised "
                              f"({ckpt.raw_config['quantization_config'].get('quant_method')})",
                              hint="quantise the original float checkpoint")
