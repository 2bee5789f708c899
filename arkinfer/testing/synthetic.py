"""Write checkpoints in the exact Hugging Face layout from a config dict and a seed.

Used for tests (tiny models of every architecture) and for memory checks on multi-GB checkpoints:
tensors are generated and written one shard at a time, so the writer never holds more than one
shard in memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from arkinfer import models


def _tensor_shapes(raw_config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    config = models.parse_config(raw_config)
    with torch.device("meta"):
        model = models.build_model(config)
    return models.module_for(raw_config).expected_weights(model)


def _init(name: str, shape: tuple[int, ...], gen: torch.Generator, std: float) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if name.endswith(".bias"):
        return 0.1 * torch.randn(shape, generator=gen)
    return std * torch.randn(shape, generator=gen)


def write_checkpoint(folder: Path, raw_config: dict[str, Any], seed: int = 0,
                     dtype: torch.dtype = torch.float32, shard_bytes: int | None = None,
                     std: float = 0.05, extra_files: dict[str, str] | None = None) -> Path:
    """Write config.json and random weights (normal(0, std); norms near 1) to `folder`.

    Shards (with model.safetensors.index.json) when `shard_bytes` is given and exceeded.
    `extra_files` maps file names (e.g. tokenizer.json) to their text.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shapes = _tensor_shapes(raw_config)
    elem = torch.tensor([], dtype=dtype).element_size()
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = elem * int(torch.Size(shape).numel())
        if shard_bytes and groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    gen = torch.Generator().manual_seed(seed)
    weight_map, total = {}, 0
    for i, names in enumerate(groups):
        file = "model.safetensors" if len(groups) == 1 else \
            f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {n: _init(n, shapes[n], gen, std).to(dtype) for n in names}
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        del tensors
        weight_map.update({n: file for n in names})
    if len(groups) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text(json.dumps(raw_config, indent=2))
    for name, text in (extra_files or {}).items():
        (folder / name).write_text(text)
    return folder


def random_q4_weight(n: int, k: int, group: int, sym: bool, seed: int = 0):
    """A random 4-bit QuantizedWeight [n, k]: codes 0..15, fp16-exact scales in [0, 0.1) per
    `group` columns, zero 8 (sym) or random zero points 0..15."""
    from arkinfer.quant.weight import QuantizedWeight

    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scales = (torch.rand(n, k // group, generator=g) * 0.1).half().float()
    zeros = torch.full((n, k // group), 8, dtype=torch.int32) if sym else \
        torch.randint(0, 16, (n, k // group), generator=g, dtype=torch.int32)
    return QuantizedWeight(codes, scales, zeros, bits=4, group_size=group, sym=sym)
