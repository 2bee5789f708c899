"""Load a quantised Hugging Face folder (gptq, marlin, awq, or ArkInfer's generic layout) as the
float reference model with dequantised weights, so `arkinfer eval` / `run` work on it.

    model = load_quantized("./smollm2-gptq")        # torch model, eval mode, float32
    logits, _ = model(ids, positions, model.empty_cache(1))

`quantization_config` in config.json selects the format: `quant_method: "gptq"` with
`checkpoint_format: "marlin"` or `is_marlin_format: true` -> marlin, else gptq; `"awq"` -> awq
(GEMM); `"arkinfer"` -> its `format` field. Every linear stored packed (`<name>.qweight`, `.B`, ...)
is unpacked with the format's numpy reference and dequantised (`scale * (code - zero)`); tensors
stored in float load as they are. Loading is strict like the float loader: a tensor the model
needs that is neither float nor packed is an error naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from arkinfer import models
from arkinfer.errors import CheckpointError, NotAvailableError
from arkinfer.frontend.model_folder import Checkpoint, open_checkpoint

from .formats import get_format


def format_of(qcfg: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(registered format name, unpack parameters) for a quantization_config dict."""
    method = str(qcfg.get("quant_method", "")).lower()
    if method == "gptq":
        marlin = qcfg.get("checkpoint_format") == "marlin" or bool(qcfg.get("is_marlin_format"))
        name = "marlin" if marlin else "gptq"
        params = {"bits": int(qcfg.get("bits", 4)), "group_size": int(qcfg.get("group_size", 128)),
                  "sym": bool(qcfg.get("sym", True))}
        return name, params
    if method == "awq":
        if str(qcfg.get("version", "gemm")).lower() != "gemm":
            raise NotAvailableError(f"AWQ version {qcfg.get('version')!r} is not supported",
                                    hint="ArkInfer reads AutoAWQ GEMM checkpoints (version gemm)")
        return "awq", {"bits": int(qcfg.get("bits", qcfg.get("w_bit", 4))),
                       "group_size": int(qcfg.get("group_size", qcfg.get("q_group_size", 128))),
                       "sym": False}
    if method == "arkinfer":
        return str(qcfg["format"]), {"bits": qcfg.get("bits"), "group_size": qcfg.get("group_size"),
                                     "sym": qcfg.get("sym")}
    raise NotAvailableError(f"quantization_config.quant_method {method!r} is not supported",
                            hint="ArkInfer loads gptq (incl. marlin), awq (gemm) and its own "
                            "'arkinfer' layouts")


def layer_format(qcfg: dict[str, Any], owner: str) -> tuple[str, dict[str, Any]] | None:
    """(format name, unpack parameters) of linear `owner` when the folder's per-layer table
    (`quantization_config.layers`, written by mixed-precision recipes) lists it; else None."""
    entry = (qcfg.get("layers") or {}).get(owner)
    if entry is None:
        return None
    return str(entry["format"]), {"bits": entry.get("bits"), "group_size": entry.get("group_size"),
                                  "sym": entry.get("sym")}


def packed_owners(ckpt: Checkpoint) -> dict[str, list[str]]:
    """linear name -> keys of its packed tensors (`...mlp.up_proj` -> [qweight, qzeros, ...]).

    A linear is packed when it has tensors besides `weight` / `bias`, or when its `weight` is not
    floating point (GGUF blocks and MLX store packed codes under `weight`)."""
    keys: dict[str, list[str]] = {}
    for n in ckpt.weights.names():
        owner, _, key = n.rpartition(".")
        if owner and key != "bias":
            keys.setdefault(owner, []).append(key)
    owners = {}
    for owner, ks in keys.items():
        if ks == ["weight"]:
            info = ckpt.weights.infos[f"{owner}.weight"]
            if info.dtype in ("F32", "F16", "BF16", "F64"):
                continue
        owners[owner] = ks
    return owners


def load_quantized_model(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The reference model of an opened quantised checkpoint, weights dequantised, eval mode."""
    qcfg = ckpt.raw_config.get("quantization_config")
    if not isinstance(qcfg, dict):
        raise CheckpointError(f"{ckpt.path}/config.json has no quantization_config",
                              hint="load float checkpoints with arkinfer.frontend.checkpoint.load")
    fmt_name, params = format_of(qcfg)
    fmt = get_format(fmt_name)
    with torch.device("meta"):
        model = models.build_model(ckpt.config)
    expected = models.module_for(ckpt.raw_config).expected_weights(model)
    owners = packed_owners(ckpt)
    state, missing = {}, []
    for name, shape in expected.items():
        owner = name[: -len(".weight")] if name.endswith(".weight") else None
        if owner in owners and len(shape) == 2:
            tensors = {k: ckpt.weights.get(f"{owner}.{k}").numpy() for k in owners[owner]}
            own = layer_format(qcfg, owner)
            unpack_fmt, unpack_params = (fmt, params) if own is None else \
                (get_format(own[0]), own[1])
            qw = unpack_fmt.unpack(tensors, shape[0], shape[1], **unpack_params)
            state[name] = qw.dequantize().to(dtype)
        elif name in ckpt.weights:
            if tuple(ckpt.weights.shape(name)) != tuple(shape):
                missing.append(f"{name}: checkpoint {list(ckpt.weights.shape(name))}, model "
                               f"expects {list(shape)}")
                continue
            state[name] = ckpt.weights.get(name).to(dtype)
        else:
            missing.append(name)
    if missing:
        shown = "; ".join(missing[:20]) + (f"; ... and {len(missing) - 20} more"
                                          if len(missing) > 20 else "")
        raise CheckpointError(f"quantised checkpoint {ckpt.path} ({fmt_name}) lacks or mis-shapes "
                              f"{len(missing)} tensor(s) the model needs: {shown}",
                              hint="the folder is incomplete or was written for another model")
    model.load_state_dict(state, strict=False, assign=True)
    if ckpt.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()


def load_quantized(folder: str | Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Open `folder` and load it with `load_quantized_model`."""
    return load_quantized_model(open_checkpoint(folder, with_tokenizer=False), dtype)


def dequantized_state(folder: str | Path) -> dict[str, np.ndarray]:
    """Every weight of a quantised folder as float32 numpy (tests, comparisons)."""
    model = load_quantized(folder)
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}
