"""Reading HF config.json values with one error that lists every problem.

Public to the model files (llama.py, minicpm.py) and to the GGUF frontend (frontend/gguf_model.py,
which checks a GGUF file's sizes against the same ranges): `ConfigReader`, `range_problem`,
`INT_LIMITS` / `FLOAT_LIMITS`.
"""

from __future__ import annotations

import math
from typing import Any

from arkinfer.errors import ConfigError

REQUIRED = object()

# Allowed ranges of config.json sizes, inclusive. Generous (today's largest models use a fraction)
# but bounded, so one absurd value (2^62 layers) is refused before it drives an allocation.
INT_LIMITS: dict[str, tuple[int, int]] = {
    "vocab_size": (1, 1 << 24),
    "hidden_size": (1, 1 << 20),
    "intermediate_size": (1, 1 << 22),
    "num_hidden_layers": (1, 4096),
    "num_attention_heads": (1, 4096),
    "num_key_value_heads": (1, 4096),
    "head_dim": (2, 1 << 14),
    "max_position_embeddings": (1, 1 << 27),
    "original_max_position_embeddings": (2, 1 << 27),
    "sliding_window": (1, 1 << 27),
    "dim_model_base": (1, 1 << 20),
}
# Floats: (exclusive low, inclusive high); every float must also be finite (json accepts NaN).
FLOAT_LIMITS: dict[str, tuple[float, float]] = {
    "rms_norm_eps": (0.0, 1.0),
    "rope_theta": (0.0, 1e12),
    "scale_emb": (0.0, 1e6),
    "scale_depth": (0.0, 1e6),
    "factor": (0.0, 1e6),
    "low_freq_factor": (0.0, 1e6),
    "high_freq_factor": (0.0, 1e6),
}


def range_problem(key: str, value: Any) -> str | None:
    """Why `value` is out of range for `key` (INT_LIMITS / FLOAT_LIMITS, finiteness), or None.

    Works on the value as written: an int is compared exactly (never converted to float first,
    which would raise OverflowError for 10**400)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"'{key}' must be a finite number, got {value!r}"
    if key in INT_LIMITS:
        low, high = INT_LIMITS[key]
        if not low <= value <= high:
            return f"'{key}' = {_short(value)} is out of range; allowed {low}..{high}"
    elif key in FLOAT_LIMITS:
        low_f, high_f = FLOAT_LIMITS[key]
        if not low_f < value <= high_f:
            return (f"'{key}' = {_short(value)} is out of range; allowed > {low_f:g} "
                    f"and <= {high_f:g}")
    elif isinstance(value, int) and value.bit_length() > 1000:
        return f"'{key}' = {_short(value)} is too large"  # float() of it would overflow
    return None


def _short(value: Any) -> str:
    """repr of a config value, huge ints abbreviated (10**400 -> 'about 1e+400', not 401 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        try:
            exponent = len(str(abs(value))) - 1
        except ValueError:  # beyond Python's int-to-str digit limit
            exponent = int((value.bit_length() - 1) * math.log10(2))
        return f"{'-' if value < 0 else ''}about 1e+{exponent}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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
        # Type first (bool is not a number; an int literal is a float's value), then the range on
        # the value as written, and only then the conversion: `"rope_theta": 0` is refused like 0.0.
        accepted = (int, float) if kind is float else kind
        if not isinstance(value, accepted) or (kind in (int, float) and isinstance(value, bool)):
            self.problems.append(f"'{key}' must be {kind.__name__}, got {_short(value)}")
            return None if default is REQUIRED else default
        if kind in (int, float):
            problem = range_problem(key, value)
            if problem is None and key not in ("bos_token_id", "pad_token_id") and value < 0:
                problem = f"'{key}' must not be negative, got {_short(value)}"
            if problem:
                self.problems.append(problem)
                return None if default is REQUIRED else default
            return float(value) if kind is float else value
        return value

    def check(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)

    def finish(self) -> None:
        if self.problems:
            raise ConfigError(f"{self.source} is not a valid config: " + "; ".join(self.problems),
                              hint="compare it with the model's published config.json")
