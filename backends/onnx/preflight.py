"""The onnx backend's preflight, from config.json alone before any weight is read: the target
profile's lists, then what the ONNX lowering takes (formats, bits, shape rules, use_nope:
`arkinfer/lowering/onnx_preflight.py`, shared with the tensorrt backend, which adds its device
gates).

Errors are `TargetError`s naming the first layer that fails and every layer name pattern affected.
"""

from __future__ import annotations

from typing import Any

from arkinfer.backend import Capabilities
from arkinfer.lowering.onnx_preflight import check_lowerable


def preflight(raw_config: dict, recipe: Any, target: Any, backend: str,
              caps: Capabilities) -> list[str]:
    """Raise TargetError when `target` does not list the recipe's format for `backend` or the ONNX
    lowering cannot take this model and recipe (`caps`: the backend's declaration); no notes."""
    if target is not None:
        target.check(backend, recipe.format if recipe is not None else None, None)
    check_lowerable(raw_config, recipe, backend, caps)
    return []
