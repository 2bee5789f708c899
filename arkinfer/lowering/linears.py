"""Every linear layer of a model, enumerated from config.json alone (no weight is read).

    linear_shapes(raw_config) -> {"model.layers.0.self_attn.q_proj": (out_features, in_features),
                                  ..., "lm_head": (vocab_size, hidden_size)}

Built from the architecture's own reference module on the meta device, so the names and shapes
are the ones the checkpoint loader and the IR use, for every architecture ArkInfer reads.
Preflights use it to name every layer a format or a kernel refuses.
"""

from __future__ import annotations

import torch

from arkinfer import models


def linear_shapes(raw_config: dict) -> dict[str, tuple[int, int]]:
    """Every nn.Linear of the model: name -> (out_features, in_features), from config.json."""
    config = models.parse_config(raw_config, "config.json")
    with torch.device("meta"):
        model = models.build_model(config)
    return {name: (m.out_features, m.in_features) for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear)}
