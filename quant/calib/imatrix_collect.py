"""Collect a llama.cpp importance matrix (imatrix) from calibration text, streaming block by block.

    im = collect_imatrix("./model", calib, progress=cb)    # quant.imatrix.Imatrix
    write_imatrix("imatrix.gguf", im)                       # what llama-quantize --imatrix reads

For every decoder linear (q, k, v, o, gate, up, down of every block) the collector adds, over
the calibration tokens the mask keeps, the square of each input column (`Σ x²`, float64 [in])
and counts the tokens: the statistic llama-imatrix gathers from every `blk.*` matrix product
(tools/imatrix/imatrix.cpp `collect_imatrix`), and the diagonal of the Hessian GPTQ accumulates
(`hessian.py`, times N/2).

The inputs are the *float* model's: one forward of the float checkpoint over the calibration
tokens, block by block as `stream.calibrate` runs it (same embedding, RoPE, batches and masks,
peak memory one block plus the activations). A quantisation run's own activations come from the
partly quantised model, so its Hessians describe that model; an imatrix describes the float one,
as llama-imatrix run on an F16/F32 GGUF does, and can be reused for any later recipe. lm_head is
left out, as llama-imatrix leaves `output.weight` out unless --process-output.

Names are GGUF names (`blk.3.attn_q.weight`); chunk_size is the calibration sequence length and
chunk_count the most tokens any linear saw over it, as llama-imatrix derives its chunk count.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from arkinfer.frontend.checkpoint import Checkpoint

from ..calib_data import CalibData
from ..imatrix import Imatrix, ImatrixEntry, gguf_weight_name
from .block import LINEARS, BlockRunner, InputHook, default_batch
from .stream import ProgressFn, load_block, open_float_source, release_maps


class ImatrixCollector:
    """Running Σ x² per input column (float64 [in]) and kept-token count per linear."""

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}
        self.counts: dict[str, int] = {}

    def add(self, name: str, x: Tensor, keep: Tensor | None = None) -> None:
        """Add the tokens of `x` [..., in] to linear `name` (rows where `keep` [...] is False are
        ignored). Squares are taken in float32 and summed in float64."""
        flat = x.detach().reshape(-1, x.shape[-1]).float()
        if keep is not None:
            flat = flat[keep.reshape(-1).to(torch.bool)]
        if name not in self.sums:
            self.sums[name] = torch.zeros(flat.shape[1], dtype=torch.float64)
            self.counts[name] = 0
        self.sums[name] += flat.square().sum(dim=0, dtype=torch.float64)
        self.counts[name] += int(flat.shape[0])

    def hook(self, name: str, mask: Tensor) -> InputHook:
        """A BlockRunner input hook adding each batch's inputs, masked by `mask` [N, T]."""
        def fn(x: Tensor, rows: slice) -> None:
            self.add(name, x, mask[rows])
        return fn

    def to_imatrix(self, datasets: list[str], chunk_size: int) -> Imatrix:
        """The collected statistics under GGUF names (Hugging Face linear names in `sums`)."""
        entries = {gguf_weight_name(n): ImatrixEntry(s.numpy()[None, :].copy(),
                                                     np.array([float(self.counts[n])]))
                   for n, s in self.sums.items()}
        top = max(self.counts.values(), default=0)
        return Imatrix(entries, list(datasets), top // chunk_size if chunk_size > 0 else 0,
                       chunk_size)


@torch.no_grad()
def collect_imatrix(source: str | Path | Checkpoint, calib: CalibData, *,
                    batch: int | None = None, progress: ProgressFn | None = None) -> Imatrix:
    """The imatrix of every decoder linear of `source` on `calib` (module docstring).
    batch: sequences per forward (default: about 4096 tokens)."""
    ckpt, model = open_float_source(source)
    cfg = ckpt.config
    seq_len = calib.seq_len
    batch = batch or default_batch(seq_len)
    emb = ckpt.weights.get("model.embed_tokens.weight")
    x = nn.functional.embedding(calib.ids, emb).float() * cfg.embedding_scale
    del emb
    release_maps(ckpt)
    rope = cfg.inv_freq(seq_len)
    collector = ImatrixCollector()
    n_layers = cfg.num_hidden_layers
    for i in range(n_layers):
        t0 = time.perf_counter()
        layer = load_block(model, ckpt, i)
        release_maps(ckpt)
        runner = BlockRunner(layer, f"model.layers.{i}.", x, calib.mask, rope, batch)
        hooks = {n: collector.hook(runner.full(n), runner.mask) for n in LINEARS}
        x = runner.run(hooks)
        model.model.layers[i] = layer.to("meta")
        del runner, layer
        if progress is not None:
            progress(i, n_layers, time.perf_counter() - t0)
    source_name = str(calib.settings.get("source", "calibration token ids"))
    return collector.to_imatrix([source_name], seq_len)
