"""`SparseConfig` — the `sparse_config` block of a MiniCPM4 / MiniCPM4.1 config.json.

Field names are the Hugging Face keys; defaults are MiniCPM4.1's (docs/infllmv2.md §1). The coarse
compression (kernel 128 / stride 64 with the defaults) has no key of its own: it is always 4x the
fine one and only approximates the softmax normaliser of stage 1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from arkinfer.errors import ConfigError

__all__ = ["COARSE_FACTOR", "SparseConfig"]

# The coarse kernel and stride are this multiple of the fine ones (HF reference, not configurable).
COARSE_FACTOR = 4

_HINT = ("compare it with MiniCPM4.1's sparse_config: kernel_size 32, kernel_stride 16, block_size 64, "
         "init_blocks 1, window_size 2048, topk 64, use_nope false, dense_len 8192")


@dataclass(frozen=True)
class SparseConfig:
    """InfLLM v2 parameters (HF `sparse_config` keys).

    kernel_size / kernel_stride: tokens per fine mean-pooled key and the stride between them.
    block_size: KV block granularity of the attention; init_blocks: leading blocks always seen.
    window_size: local window in tokens (`local_blocks = window_size // block_size`).
    topk: selection budget on top of the window (`budget = topk + local_blocks` blocks in total).
    use_nope: score blocks with pre-RoPE queries/keys. dense_len: total length below which plain
    dense attention runs (-1: always sparse).
    """

    kernel_size: int = 32
    kernel_stride: int = 16
    block_size: int = 64
    init_blocks: int = 1
    window_size: int = 2048
    topk: int = 64
    use_nope: bool = False
    dense_len: int = 8192

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise ConfigError("invalid sparse_config: " + "; ".join(problems), hint=_HINT)

    # -- derived sizes ------------------------------------------------------------------------
    @property
    def local_blocks(self) -> int:
        """Blocks of the local window besides the query's own block (32 for MiniCPM4.1)."""
        return self.window_size // self.block_size

    @property
    def budget(self) -> int:
        """Blocks selected per query and KV head: topk + local_blocks (96 for MiniCPM4.1)."""
        return self.topk + self.local_blocks

    @property
    def coarse_kernel_size(self) -> int:
        return COARSE_FACTOR * self.kernel_size

    @property
    def coarse_kernel_stride(self) -> int:
        return COARSE_FACTOR * self.kernel_stride

    @property
    def kernels_per_block(self) -> int:
        """Fine-kernel strides per block (4): block b pools fine kernels [4b - 1, 4b + 3]."""
        return self.block_size // self.kernel_stride

    @property
    def full_visibility_len(self) -> int:
        """Positions below budget * block_size (6144) see every past block: sparse == dense there."""
        return self.budget * self.block_size

    def is_dense(self, total_len: int) -> bool:
        """True when a forward call over `total_len` = cache_len + q_len keys runs dense (§5)."""
        return self.dense_len >= 0 and total_len < self.dense_len

    # -- (de)serialisation --------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "sparse_config") -> SparseConfig:
        """Build from a config.json `sparse_config` dict; every problem is reported in one error.

        Missing keys take MiniCPM4.1's defaults; unknown keys, wrong types and inconsistent sizes
        raise `ConfigError`.
        """
        if not isinstance(d, dict):
            raise ConfigError(f"{source} must be a JSON object, got {type(d).__name__}", hint=_HINT)
        known = {f.name: f for f in fields(cls)}
        problems = []
        unknown = sorted(set(d) - set(known))
        if unknown:
            problems.append(f"unknown keys {unknown} (known: {sorted(known)})")
        kw: dict[str, Any] = {}
        for name, value in d.items():
            if name not in known:
                continue
            want = bool if name == "use_nope" else int
            # bool is an int in Python: reject True for sizes and 1 for use_nope alike.
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                problems.append(f"'{name}' must be {want.__name__}, got {value!r}")
                continue
            kw[name] = value
        if not problems:
            candidate = {**asdict(cls()), **kw}
            problems = _problems_of(candidate)
        if problems:
            raise ConfigError(f"{source} is not a valid InfLLM v2 config: " + "; ".join(problems),
                              hint=_HINT)
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        """The HF `sparse_config` dict (round-trips through `from_dict`)."""
        return asdict(self)


def _problems(cfg: SparseConfig) -> list[str]:
    return _problems_of(asdict(cfg))


def _problems_of(c: dict[str, Any]) -> list[str]:
    """Every inconsistency of a candidate config, as readable sentences."""
    p = []
    for name in ("kernel_size", "kernel_stride", "block_size", "window_size"):
        if c[name] <= 0:
            p.append(f"'{name}' must be positive, got {c[name]}")
    for name in ("init_blocks", "topk"):
        if c[name] < 0:
            p.append(f"'{name}' must not be negative, got {c[name]}")
    if c["dense_len"] < -1:
        p.append(f"'dense_len' must be >= 0 or -1 (always sparse), got {c['dense_len']}")
    if p:
        return p
    if c["block_size"] % c["kernel_stride"]:
        p.append(f"block_size={c['block_size']} must be a multiple of "
                 f"kernel_stride={c['kernel_stride']} (kernels are max-pooled into blocks)")
    if c["kernel_size"] < c["kernel_stride"]:
        p.append(f"kernel_size={c['kernel_size']} must be >= kernel_stride={c['kernel_stride']} "
                 "(kernels must cover every key)")
    if c["window_size"] % c["block_size"]:
        p.append(f"window_size={c['window_size']} must be a multiple of "
                 f"block_size={c['block_size']}")
    # The forced blocks (init + window + own block) must fit the budget, or top-k would have to
    # drop forced blocks and the local window would no longer be guaranteed.
    if c["topk"] < c["init_blocks"] + 1:
        p.append(f"topk={c['topk']} must be >= init_blocks + 1 = {c['init_blocks'] + 1} so the "
                 "init blocks, the local window and the query's own block fit the budget")
    return p
