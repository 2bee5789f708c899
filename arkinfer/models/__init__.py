"""Reference models, one file per HF `model_type`; this module maps model_type to its file."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from arkinfer.errors import ConfigError

# model file -> the HF model_type values it implements
_FILES = ("llama", "minicpm")


def _modules() -> dict[str, ModuleType]:
    table = {}
    for name in _FILES:
        module = importlib.import_module(f"arkinfer.models.{name}")
        for model_type in module.MODEL_TYPES:
            table[model_type] = module
    return table


def supported_model_types() -> list[str]:
    return sorted(_modules())


def module_for(raw_config: dict[str, Any], source: str = "config.json") -> ModuleType:
    model_type = raw_config.get("model_type")
    table = _modules()
    if not isinstance(model_type, str) or model_type not in table:
        raise ConfigError(f"{source}: model_type {model_type!r} is not supported",
                          hint=f"supported model types: {', '.join(sorted(table))}")
    return table[model_type]


def parse_config(raw_config: dict[str, Any], source: str = "config.json"):
    """The typed config dataclass (LlamaConfig or a subclass) for a raw config.json dict."""
    return module_for(raw_config, source).ConfigClass.from_hf(raw_config, source)


def build_model(config) -> Any:
    """An uninitialised reference model for `config` (use under `torch.device('meta')` to size it)."""
    return module_for(config.raw).ModelClass(config)
