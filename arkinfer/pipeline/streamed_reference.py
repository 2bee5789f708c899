"""The float model's logits on the verify prompts with one decoder block in memory at a time.

    logits = streamed_window_logits(Path("./MiniCPM4.1-8B"), prompts, dense=True)
    # [T_i, V] float32 per prompt, equal to ReferenceRunner(path).window_logits(prompt_i)

An 8B model is 32 GB in float32 (16 GB in bf16): more than a 24 GB machine holds beside the
runtime it is compared with. The verify prompts are a few hundred tokens, so their hidden states
are small; this runs them through the model block by block instead of prompt by prompt:

1. the embedding rows of the prompts' tokens, times the config's embedding scale ([1, T_i, H]
   float32 per prompt);
2. for each decoder block: its tensors read from the memory-mapped checkpoint as float32 (the
   calibration loader, quant/calib/stream.py), every prompt's hidden states run through it with an
   empty cache at positions 0..T_i-1 and the RoPE tables of a T_i-token call — the same ops as
   `LlamaForCausalLM.forward` on one prompt — then the block is dropped;
3. the final norm, the logit divisor and the output layer (the embedding when tied).

Peak memory: one float32 block + the output layer's float32 weight + the prompts' hidden states and
logits (MiniCPM4.1-8B: ~2.5 GB), never the model. InfLLM v2 runs inside the blocks as in the
whole model; `dense=True` forces dense attention (what a runtime without InfLLM v2 is compared
with).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn


def fits_in_memory(source: Path, share: float = 0.8) -> bool:
    """True when the float32 model of `source` (a folder or a .gguf file) takes at most `share`
    of the memory available now (psutil: free plus reclaimable page cache): the whole-model
    reference is then the faster way."""
    import psutil

    if Path(source).is_file() and Path(source).suffix == ".gguf":
        from arkinfer.frontend.gguf_lazy import open_gguf_lazily

        weights = open_gguf_lazily(Path(source)).weights
    else:
        from arkinfer.frontend.checkpoint import open_checkpoint

        weights = open_checkpoint(source, with_tokenizer=False).weights
    numel = sum(int(torch.Size(weights.shape(n)).numel()) for n in weights.names())
    return numel * 4 <= share * psutil.virtual_memory().available


@torch.no_grad()
def streamed_window_logits(source: Path, prompts: list[list[int]], dense: bool = False,
                           progress: Callable[[str], None] | None = None) -> list[Tensor]:
    """Logits [T_i, V] float32 of the float model of `source` for every prompt (module
    docstring). `dense`: force dense attention on an InfLLM v2 model. A `.gguf` file is read
    tensor by tensor (frontend/gguf_lazy.py), never imported."""
    from arkinfer.quant.calib.stream import (
        load_block,
        open_float_source,
        release_maps,
        tail_weight,
    )

    if Path(source).is_file() and Path(source).suffix == ".gguf":
        from arkinfer.frontend.gguf_lazy import open_gguf_lazily

        source = open_gguf_lazily(Path(source))
    ckpt, model = open_float_source(source)
    cfg = ckpt.config
    emb = ckpt.weights.get("model.embed_tokens.weight")
    hidden = [nn.functional.embedding(torch.tensor([ids]), emb).float() * cfg.embedding_scale
              for ids in prompts]
    del emb
    release_maps(ckpt)
    n_layers = cfg.num_hidden_layers
    for i in range(n_layers):
        if progress is not None:
            progress(f"float reference, block {i + 1}/{n_layers} (streamed)")
        layer = load_block(model, ckpt, i)
        release_maps(ckpt)
        if dense and hasattr(layer.self_attn, "force_dense"):
            layer.self_attn.force_dense = True
        for j, h in enumerate(hidden):
            t = h.shape[1]
            empty = h.new_zeros((1, cfg.num_key_value_heads, 0, cfg.head_dim))
            hidden[j], _ = layer(h, torch.arange(t), cfg.inv_freq(t), (empty, empty))
        model.model.layers[i] = layer.to("meta")
        del layer
    norm_w = ckpt.weights.get("model.norm.weight").float()
    head = tail_weight(ckpt)
    release_maps(ckpt)
    out = []
    for h in hidden:
        h = torch.ops.arkinfer.rms_norm(h, norm_w, cfg.rms_norm_eps)
        if cfg.logit_divisor != 1.0:
            h = h / cfg.logit_divisor
        out.append((h[0] @ head.T).float())
    return out


class StreamedReference:
    """`window_logits` of the streamed float model for a fixed set of prompts, computed together
    on construction (what `verify.RecordedLogits` records from a runner); `tokenizer`: the one the
    prompts were made with (None when the caller has none at hand)."""

    def __init__(self, source: Path, prompts: list[list[int]], tokenizer: object,
                 dense: bool = False, progress: Callable[[str], None] | None = None) -> None:
        self.tokenizer = tokenizer
        self._logits = {tuple(p): t for p, t in
                        zip(prompts, streamed_window_logits(source, prompts, dense, progress))}

    def window_logits(self, ids: list[int]) -> Tensor:
        return self._logits[tuple(ids)]
