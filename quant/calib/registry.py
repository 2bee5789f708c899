"""Calibration name -> config dataclass -> handler (torchao style: a config selects its handler).

    config = config_for(QuantRecipe("gptq", "gptq", bits=4, group_size=128, desc_act=True))
    handler = handler_for(config)            # GPTQCalibrator(GPTQConfig(...))
    handler_for(AWQConfig(group_size=64))    # any config works directly, with its own options

A new algorithm registers its config class with `register(name, config_cls, handler_cls)`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..recipe import QuantRecipe
from ..weight import QuantError
from .awq import AWQCalibrator, AWQConfig
from .base import BlockCalibrator
from .gptq import GPTQCalibrator, GPTQConfig
from .pgptq import PGPTQCalibrator, PGPTQConfig
from .simple import RTNCalibrator, RTNConfig, TernaryCalibrator, TernaryConfig

_BY_NAME: dict[str, type] = {}
_HANDLERS: dict[type, type[BlockCalibrator]] = {}


def register(name: str, config_cls: type, handler_cls: type[BlockCalibrator]) -> None:
    """Make `name` (a QuantRecipe.calib value) build `config_cls`, handled by `handler_cls`."""
    if name in _BY_NAME:
        raise ValueError(f"calibration {name!r} is registered twice")
    _BY_NAME[name] = config_cls
    _HANDLERS[config_cls] = handler_cls


register("rtn", RTNConfig, RTNCalibrator)
register("gptq", GPTQConfig, GPTQCalibrator)
register("pgptq", PGPTQConfig, PGPTQCalibrator)
register("awq", AWQConfig, AWQCalibrator)
register("ternary", TernaryConfig, TernaryCalibrator)


def calibration_names() -> list[str]:
    return list(_BY_NAME)


def config_for(recipe: QuantRecipe, **options: Any) -> Any:
    """The config of `recipe.calib` filled from the recipe (bits, group_size, sym, desc_act, grid) and
    `options` (any other field of that config, e.g. damp=0.05, prefix_skip=2, n_grid=10)."""
    if recipe.calib not in _BY_NAME:
        raise QuantError(f"calibration {recipe.calib!r} has no handler; registered "
                         f"{calibration_names()}", "pick a registered calibration")
    cls = _BY_NAME[recipe.calib]
    fields = {f.name for f in dataclasses.fields(cls)}
    kw: dict[str, Any] = {}
    if recipe.calib == "ternary":
        kw["group_size"] = "row" if recipe.group_size == -1 else recipe.group_size
    else:
        kw.update(bits=recipe.bits, group_size=recipe.group_size, sym=recipe.sym)
        if "act_order" in fields:
            kw["act_order"] = recipe.desc_act
        if "grid" in fields:
            kw["grid"] = recipe.grid
    unknown = sorted(set(options) - fields)
    if unknown:
        raise QuantError(f"option(s) {unknown} do not apply to {recipe.calib}; its options are "
                         f"{sorted(fields)}", "drop them or pick the algorithm they belong to")
    kw.update(options)
    return cls(**kw)


def handler_for(config: Any) -> BlockCalibrator:
    """The handler of a config instance (exact type match, so subclasses register themselves)."""
    cls = _HANDLERS.get(type(config))
    if cls is None:
        raise QuantError(f"{type(config).__name__} has no calibration handler; registered "
                         f"{[c.__name__ for c in _HANDLERS]}", "register it with register()")
    return cls(config)


def config_as_dict(config: Any) -> dict[str, Any]:
    return {"calib": next(n for n, c in _BY_NAME.items() if c is type(config)),
            **dataclasses.asdict(config)}
