"""Calibration: how codes and scales are chosen from activations (docs/quant.md §2-§5).

    from arkinfer.quant.calib import GPTQConfig, handler_for, gptq_quantize
    res = gptq_quantize(w, H, bits=4, group_size=128, act_order=True)   # one layer
    quantize_model("./model", QuantRecipe("gptq", "gptq"), calib, out="./model-gptq")  # stream

Layer-level algorithms: `gptq_quantize` (GPTQ), P-GPTQ (GPTQ with `prefix_skip`), AWQ
(`search_scale` / `search_clip`), RTN and ternary adapters. Block handlers (`handler_for(config)`)
run them inside one decoder block; `stream.quantize_model` streams a checkpoint block by block.
"""

from .awq import AWQCalibrator, AWQConfig, search_clip, search_scale
from .base import BlockCalibrator, BlockResult, CalibContext, LinearReport, StrictError
from .block import LINEARS, SEQUENTIAL_GROUPS, BlockRunner
from .gptq import (
    GPTQCalibrator,
    GPTQConfig,
    GPTQResult,
    gptq_quantize,
    inverse_cholesky,
)
from .hessian import HessianAccumulator, prefix_mask, prefix_split
from .pgptq import PGPTQCalibrator, PGPTQConfig
from .registry import (
    calibration_names,
    config_as_dict,
    config_for,
    handler_for,
    register,
)
from .simple import RTNCalibrator, RTNConfig, TernaryCalibrator, TernaryConfig

__all__ = [
    "LINEARS",
    "SEQUENTIAL_GROUPS",
    "AWQCalibrator",
    "AWQConfig",
    "BlockCalibrator",
    "BlockResult",
    "BlockRunner",
    "CalibContext",
    "GPTQCalibrator",
    "GPTQConfig",
    "GPTQResult",
    "HessianAccumulator",
    "LinearReport",
    "PGPTQCalibrator",
    "PGPTQConfig",
    "RTNCalibrator",
    "RTNConfig",
    "StrictError",
    "TernaryCalibrator",
    "TernaryConfig",
    "calibration_names",
    "config_as_dict",
    "config_for",
    "gptq_quantize",
    "handler_for",
    "inverse_cholesky",
    "prefix_mask",
    "prefix_split",
    "register",
    "search_clip",
    "search_scale",
]
