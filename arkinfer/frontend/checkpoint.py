"""Load a Hugging Face model folder's reference model strictly: float weights here, a quantised
folder (config.json with `quantization_config`) through `quant.load`.

    ckpt, model = load("./model")            # open_checkpoint + load_model

Opening the folder (config, headers, tokenizer, the layer and embedding checks) is
`model_folder.py`, one layer below: `quant.load` imports that, not this module, so the two never
import each other. Its names are re-exported here (`from arkinfer.frontend.checkpoint import
open_checkpoint` keeps working).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from arkinfer import models
from arkinfer.errors import ArkError, CheckpointError
from arkinfer.frontend.model_folder import (  # noqa: F401 - re-exported (module docstring)
    FLOAT_DTYPES,
    Checkpoint,
    check_layers,
    open_checkpoint,
    read_config,
    read_generation_config,
    resolve_model_path,
)
from arkinfer.frontend.safetensors_io import LazyWeights


def check_memory(nbytes: int, what: str, error: type[ArkError] = CheckpointError,
                 hint: str = "free memory, use a machine with more RAM, or use a smaller or "
                 "quantised model") -> None:
    """Raise `error` when `nbytes` exceed the memory this machine has available now (psutil
    `available`: free plus reclaimable page cache), before anything is allocated."""
    import psutil

    available = int(psutil.virtual_memory().available)
    if nbytes > available:
        raise error(f"{what} needs {nbytes / 1024**3:.2f} GiB of memory but this machine has "
                    f"{available / 1024**3:.2f} GiB available", hint=hint)


def check_weights(expected: dict[str, tuple[int, ...]], weights: LazyWeights, source: Path) -> None:
    """Raise one CheckpointError listing every missing, unexpected, mis-shaped and non-float tensor."""
    missing = [n for n in expected if n not in weights]
    unexpected = [n for n in weights.names() if n not in expected
                  and not n.endswith("rotary_emb.inv_freq")]
    misshaped = [f"{n}: checkpoint {list(weights.shape(n))}, model expects {list(expected[n])}"
                 for n in expected if n in weights and weights.shape(n) != expected[n]]
    wrong_dtype = [f"{n}: checkpoint {weights.infos[n].dtype}, model expects a float dtype "
                   f"({'/'.join(FLOAT_DTYPES)})" for n in expected
                   if n in weights and weights.infos[n].dtype not in FLOAT_DTYPES]
    if not (missing or unexpected or misshaped or wrong_dtype):
        return
    lines = []
    for title, items in (("missing", missing), ("unexpected", unexpected),
                         ("wrong shape", misshaped), ("wrong dtype", wrong_dtype)):
        if items:
            shown = items[:20] + ([f"... and {len(items) - 20} more"] if len(items) > 20 else [])
            lines.append(f"{title} ({len(items)}): " + "; ".join(shown))
    raise CheckpointError(f"weights in {source} do not match the {len(expected)}-tensor model "
                          "described by config.json:\n  " + "\n  ".join(lines),
                          hint="the config and the weights come from different models, or the "
                          "export was incomplete")


def load_model(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The reference model with the checkpoint's weights (strict), in `dtype`, in eval mode.

    A quantised checkpoint (config.json with `quantization_config`) is unpacked by its format's
    reference unpack into dequantised float weights."""
    if "quantization_config" in ckpt.raw_config:
        from arkinfer.quant.load import load_quantized_model

        return load_quantized_model(ckpt, dtype)
    with torch.device("meta"):
        model = models.build_model(ckpt.config)
    expected = models.module_for(ckpt.raw_config).expected_weights(model)
    check_weights(expected, ckpt.weights, ckpt.path)
    numel = sum(math.prod(shape) for shape in expected.values())
    check_memory(numel * torch.empty((), dtype=dtype).element_size(),
                 f"loading {ckpt.path} ({numel:,} parameters) in {dtype}")
    state = {name: ckpt.weights.get(name).to(dtype) for name in expected}
    model.load_state_dict(state, strict=False, assign=True)
    if ckpt.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()


def load(name: str | Path, dense: bool = False, dtype: torch.dtype = torch.float32,
         sparse_impl: str = "fast") -> tuple[Checkpoint, torch.nn.Module]:
    """Open and load in one call. On sparse-config (InfLLM v2) models `dense=True` forces dense
    attention and `sparse_impl` picks the "fast" CPU implementation or the literal "reference"."""
    ckpt = open_checkpoint(name)
    model = load_model(ckpt, dtype)
    if hasattr(model, "set_dense"):
        model.set_dense(dense)
        model.set_sparse_impl(sparse_impl)
    return ckpt, model
