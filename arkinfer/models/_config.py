"""Reading HF config.json values with one error that lists every problem."""

from __future__ import annotations

from typing import Any

from arkinfer.errors import ConfigError

REQUIRED = object()


class ConfigReader:
    """Collects missing / mistyped keys of a config dict so they are reported together.

    >>> r = ConfigReader(cfg, "config.json"); h = r.get("hidden_size", int); r.finish()
    """

    def __init__(self, raw: dict[str, Any], source: str) -> None:
        self.raw, self.source, self.problems = raw, source, []

    def get(self, key: str, kind: type, default: Any = REQUIRED) -> Any:
        if key not in self.raw or self.raw[key] is None:
            if default is REQUIRED:
                self.problems.append(f"missing key '{key}' ({kind.__name__})")
            return None if default is REQUIRED else default
        value = self.raw[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            self.problems.append(f"'{key}' must be {kind.__name__}, got {value!r}")
            return None if default is REQUIRED else default
        if kind in (int, float) and key not in ("bos_token_id", "pad_token_id") and value < 0:
            self.problems.append(f"'{key}' must not be negative, got {value!r}")
        return value

    def check(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)

    def finish(self) -> None:
        if self.problems:
            raise ConfigError(f"{self.source} is not a valid config: " + "; ".join(self.problems),
                              hint="compare it with the model's published config.json")
