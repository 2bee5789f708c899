"""The weights a lowering reads from `LowerRequest.model_dir`: a float Hugging Face folder, or a
quantised one in any registered format (`quant.load`'s conventions), read lazily one tensor at a
time.

    src = SourceWeights(model_dir)
    src.format, src.params          # ("gptq", {"bits": 4, "group_size": 128, "sym": True}),
                                    # (None, {}) for a float folder
    src.packed("model.layers.0.mlp.up_proj.weight", (out, in))     -> PackedLinear | None
    src.quantised("model.layers.0.mlp.up_proj.weight", (out, in))  -> QuantizedWeight | None
    src.tensor("model.norm.weight")    -> torch tensor in its stored dtype
    src.float32("model.norm.weight")   -> float32 numpy

A linear is packed when the folder is quantised and the linear has tensors besides
`weight` / `bias`, or a `weight` that is not floating point (`quant.load.packed_owners`). A
backend that carries the stored layout into its graph (onnx: the arkinfer-domain functions
unpack it) takes `packed`; one that repacks the codes into its own layout (coreml, tvm) takes
`quantised`, the canonical weight (`quant/weight.py`) named after its linear.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arkinfer.errors import ArkError
from arkinfer.frontend.checkpoint import open_checkpoint
from arkinfer.quant.formats import get_format
from arkinfer.quant.load import format_of, packed_owners
from arkinfer.quant.weight import QuantizedWeight


@dataclass
class PackedLinear:
    """One quantised linear as the folder stores it: `tensors` keyed by the format's suffixes
    (marlin: B, s; gptq: qweight, qzeros, scales, g_idx; ...), logical shape [out, in]."""

    owner: str
    format: str
    tensors: dict[str, np.ndarray]
    out_features: int
    in_features: int
    params: dict[str, Any]

    def canonical(self) -> QuantizedWeight:
        """The canonical weight (the format's numpy unpack reference), named `owner`."""
        qw = get_format(self.format).unpack(self.tensors, self.out_features, self.in_features,
                                            **self.params)
        object.__setattr__(qw, "name", self.owner)  # frozen; the name is for messages only
        return qw


class SourceWeights:
    """Tensors of a float or quantised Hugging Face folder (see the module docstring)."""

    def __init__(self, folder: str | Path) -> None:
        self.ckpt = open_checkpoint(folder, with_tokenizer=False)
        self.raw = self.ckpt.raw_config
        qcfg = self.raw.get("quantization_config")
        self.format, self.params = format_of(qcfg) if isinstance(qcfg, dict) else (None, {})
        self._owners = packed_owners(self.ckpt) if self.format else {}

    def packed(self, weight_name: str, shape: tuple[int, ...]) -> PackedLinear | None:
        """The packed linear stored for `<owner>.weight` of logical shape [out, in], or None
        when that weight is stored float (or is no linear's weight)."""
        owner = weight_name.removesuffix(".weight")
        if owner == weight_name or owner not in self._owners:
            return None
        tensors = {k: self.ckpt.weights.get(f"{owner}.{k}").numpy() for k in self._owners[owner]}
        return PackedLinear(owner, str(self.format), tensors, int(shape[0]), int(shape[1]),
                            dict(self.params))

    def quantised(self, weight_name: str, shape: tuple[int, ...]) -> QuantizedWeight | None:
        """The canonical weight stored for `<owner>.weight` [out, in], None when stored float."""
        packed = self.packed(weight_name, shape)
        return None if packed is None else packed.canonical()

    def tensor(self, name: str) -> torch.Tensor:
        """Tensor `name` as stored (its own dtype)."""
        return self.ckpt.weights.get(name)

    def float32(self, name: str) -> np.ndarray:
        """Float tensor `name` as float32 numpy; ArkError naming it when the folder lacks it."""
        if name not in self.ckpt.weights:
            raise ArkError(f"{self.ckpt.path} has no tensor {name!r} (the IR reads it)",
                           hint="the folder was written for another model; rebuild it")
        return self.ckpt.weights.get(name).to(torch.float32).numpy()

    def __contains__(self, name: str) -> bool:
        return name in self.ckpt.weights
