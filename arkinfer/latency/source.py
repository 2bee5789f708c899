"""Where `arkinfer plan` gets a model's config.json and safetensors headers (never tensor data).

MODEL may be a known config name (`KNOWN_CONFIGS`: plan without weights), a config.json file, or a
model folder (config.json plus, when present, the safetensors headers for exact tensor sizes;
'demo' is the embedded demo model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arkinfer.errors import ConfigError
from arkinfer.models.configs import MINICPM4_1_8B, SPARSE_CONFIG_4_1

# MiniCPM4.1-8B as deployed with InfLLM v2: the released config plus the sparse_config users add
# (docs/model.md §1, docs/infllmv2.md §1).
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "minicpm4.1-8b": {**MINICPM4_1_8B, "sparse_config": dict(SPARSE_CONFIG_4_1)},
    "minicpm4.1-8b-dense": dict(MINICPM4_1_8B),
}


@dataclass(frozen=True)
class ModelSource:
    """A model's config.json dict, its safetensors headers (None: size from the config) and a
    label saying where they came from."""

    label: str
    raw_config: dict[str, Any]
    headers: dict[str, Any] | None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path} as JSON: {exc}",
                          hint="point at a config.json or a model folder") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a JSON object, found {type(raw).__name__}")
    return raw


def load_source(model: str) -> ModelSource:
    """The config and headers of `model` (see the module docstring)."""
    key = model.strip().lower()
    if key in KNOWN_CONFIGS:
        return ModelSource(f"{key} (built-in config.json, no weights)",
                           json.loads(json.dumps(KNOWN_CONFIGS[key])), None)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".json":
        return ModelSource(f"{path} (config.json only: sizes from the config)", _read_json(path),
                           None)
    if not path.exists() and model != "demo":
        raise ConfigError(f"model {model!r} is not a known config name, a config.json or a model "
                          "folder", hint=f"known names: {', '.join(KNOWN_CONFIGS)}; or give a "
                          "path to config.json or to a Hugging Face folder")
    from arkinfer.frontend.checkpoint import read_config, resolve_model_path
    from arkinfer.frontend.safetensors_io import read_header, weight_files

    folder = resolve_model_path(model)
    raw = read_config(folder)
    if not any(folder.glob("*.safetensors")):
        return ModelSource(f"{folder} (config.json only: sizes from the config)", raw, None)
    headers: dict[str, Any] = {}
    for file in weight_files(folder):
        headers.update(read_header(file))
    return ModelSource(f"{folder} (config.json + safetensors headers)", raw, headers)
