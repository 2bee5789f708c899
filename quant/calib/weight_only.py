"""Weight-only recipes (RTN, ternary): quantise tensor by tensor from the memory-mapped checkpoint.

RTN and absmean ternary choose their codes from the weights alone, so they need no calibration
tokens and no block forward passes: each decoder linear is read (memory-mapped), quantised, checked
against the format and written to the same per-block work files `stream.calibrate` writes, so
`quant.export.export_folder` and every backend take the result unchanged. The codes are identical
to the streaming path's (same handler, same float32 weights); only the SNR report, which needs
activations, is missing — ask for it with `--report` (the streaming path on a small sample).

    run = quantize_weight_only("./model", get_preset("q4_0"), "./out.work", progress=cb)

Cost: one read of every linear and one quantisation of it; for SmolLM2-135M a few seconds.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from arkinfer.frontend.checkpoint import Checkpoint, open_checkpoint
from arkinfer.output_folder import fresh_work_folder

from ..recipe import QuantRecipe
from ..weight import QuantError
from .base import CalibContext, LinearReport, context_for
from .block import LINEARS
from .registry import config_as_dict, config_for, handler_for
from .stream import (
    CalibrationRun,
    ProgressFn,
    block_file,
    check_source,
    load_info,
    release_maps,
    save_tail,
    save_weights,
    tail_weight,
)

WEIGHT_ONLY = ("rtn", "ternary")
NO_CALIBRATION = {"source": "none (weight-only recipe: codes from the weights alone)",
                  "samples": 0, "seq_len": 0, "tokens": 0, "sha256": None}


def is_weight_only(recipe: QuantRecipe) -> bool:
    """True for recipes whose codes do not depend on activations (RTN, ternary)."""
    return recipe.calib in WEIGHT_ONLY


@torch.no_grad()
def quantize_weight_only(source: str | Path | Checkpoint, recipe: QuantRecipe,
                         work_dir: str | Path, *, options: dict[str, Any] | None = None,
                         strict: bool = False, progress: ProgressFn | None = None
                         ) -> CalibrationRun:
    """Quantise every decoder linear (and lm_head unless skipped) of `source` with the weight-only
    `recipe`; same outputs and work-file layout as `stream.calibrate`, without activations."""
    if not is_weight_only(recipe):
        raise ValueError(f"recipe {recipe.describe()} needs calibration; use stream.calibrate")
    if recipe.budget is not None:
        raise QuantError(f"recipe {recipe.describe()}: mixed precision measures sensitivity on "
                         "calibration text, which weight-only recipes do not read",
                         "use a calibrated recipe (gptq) for a bits budget")
    t_start = time.perf_counter()
    ckpt = source if isinstance(source, Checkpoint) else open_checkpoint(source, with_tokenizer=False)
    check_source(ckpt)
    config = config_for(recipe, **(options or {}))
    handler = handler_for(config)
    ctx = context_for(recipe, frozenset(), strict)
    work_dir = Path(work_dir)
    fresh_work_folder(work_dir)
    n_layers = ckpt.config.num_hidden_layers
    for i in range(n_layers):
        t0 = time.perf_counter()
        quantized, reports = {}, []
        for name in LINEARS:
            full = f"model.layers.{i}.{name}"
            if recipe.skips(full):
                reports.append(LinearReport(full, "skipped", "float",
                                            reason="matches a skip pattern"))
                continue
            w = ckpt.weights.get(full + ".weight").to(torch.float32, copy=True)
            qw = handler.quantize_weight(w, full, ctx)
            why = ctx.refusal(qw, full)
            if why is None:
                quantized[full] = qw
                reports.append(LinearReport(full, "quantised", handler.describe()))
            else:
                reports.append(LinearReport(full, "refused", "float", reason=why))
        release_maps(ckpt)
        info = {"block": i, "seconds": round(time.perf_counter() - t0, 3), "block_snr_db": None,
                "linears": [r.as_dict() for r in reports]}
        save_weights(block_file(work_dir, i), quantized, {}, info)
        if progress is not None:
            progress(i, n_layers, info["seconds"])
    blocks = [load_info(block_file(work_dir, i)) for i in range(n_layers)]
    tail = _tail(ckpt, recipe, handler, ctx, work_dir)
    return CalibrationRun(ckpt.path, work_dir, recipe, config_as_dict(config),
                          dict(NO_CALIBRATION), n_layers, blocks, tail,
                          round(time.perf_counter() - t_start, 3))


def _tail(ckpt: Checkpoint, recipe: QuantRecipe, handler, ctx: CalibContext,
          work_dir: Path) -> dict | None:
    """lm_head from its weights alone (unless the recipe skips it), as `stream._tail` stores it."""
    if recipe.skips("lm_head"):
        return None
    w = tail_weight(ckpt)
    release_maps(ckpt)
    return save_tail(work_dir / "tail.safetensors", handler, ctx, w, None)
