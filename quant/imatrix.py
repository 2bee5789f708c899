"""llama.cpp importance matrices (imatrix): read, write, and match them to a model's linears.

An imatrix holds, for every linear layer, the sum over calibration tokens of the square of each
input column's activation and the number of tokens counted:

    sums    Σ_t x[t, k]²   [n_mat, in_features]   (n_mat = 1; a MoE weight has one row per expert)
    counts  N              [n_mat]

`sums / counts` is the activations' mean square per input column (the diagonal of GPTQ's
Hessian `2/N Σ x xᵀ`, halved). llama-quantize weighs each column's rounding error by it;
`quant/rtn.py`'s mse grid takes it as `importance` (the RTN handler does, given
`RTNConfig.imatrix`).

    im = read_imatrix("imatrix.gguf")       # GGUF or legacy .dat, told apart by the magic
    im.importance("model.layers.3.mlp.down_proj", 1536)   # torch float32 [1536], or None
    im.match({"model.layers.0.self_attn.q_proj": 576, ...})   # found / missing / unused
    write_imatrix("out.gguf", im)           # a name ending in .dat: the legacy layout

Entries are keyed by GGUF tensor names (`blk.3.ffn_down.weight`); Hugging Face linear names
(`model.layers.3.mlp.down_proj`) map to them through `backends/gguf/tensors.gguf_name`. Input
columns are in the same order in both: llama.cpp's q/k permutation reorders output rows only.
Byte layouts: `quant/imatrix_layout.py`. Writing from a calibration: `quant/calib/imatrix_collect.py`.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .imatrix_layout import (
    GGUF_MAGIC,
    ImatrixError,
    decode_dat,
    decode_gguf,
    encode_dat,
    encode_gguf,
)

MAX_BYTES = 4 << 30  # a dense 70B model's imatrix is ~10 MB; MoE files reach a few hundred MB
_REMAKE = ("make one for this model: arkinfer quantize MODEL --save-imatrix imatrix.gguf ..., "
           "or llama-imatrix -m MODEL.gguf -f text.txt -o imatrix.gguf")

__all__ = ["Imatrix", "ImatrixEntry", "ImatrixError", "ImatrixMatch", "check_imatrix_path",
           "gguf_weight_name", "read_imatrix", "write_imatrix"]


def gguf_weight_name(linear: str) -> str:
    """`model.layers.3.mlp.up_proj` (a linear, no `.weight`) -> `blk.3.ffn_up.weight`."""
    from arkinfer.backends.gguf.tensors import gguf_name

    return gguf_name(linear + ".weight")


@dataclass
class ImatrixEntry:
    """One weight's statistics. sums: float64 [n_mat, n_in] (Σ x² per input column; for a file
    read from the legacy layout, mean square · ncall); counts: float64 [n_mat] (tokens; legacy:
    ncall)."""

    sums: np.ndarray
    counts: np.ndarray

    @property
    def n_in(self) -> int:
        return int(self.sums.shape[1])

    @property
    def n_mat(self) -> int:
        return int(self.sums.shape[0])

    def mean_square(self) -> np.ndarray:
        """float32 [n_mat, n_in]: sums / counts; 1 for a row with no tokens (llama-quantize's
        load_imatrix)."""
        counts = self.counts[:, None]
        return np.where(counts > 0, self.sums / np.where(counts > 0, counts, 1.0),
                        1.0).astype(np.float32)


@dataclass
class ImatrixMatch:
    """An imatrix against a model's linears. importance: linear -> float32 [in_features];
    missing: linears with no entry (quantised without importance); unused: GGUF names of
    entries no linear asked for."""

    importance: dict[str, torch.Tensor]
    missing: list[str]
    unused: list[str]

    def describe(self) -> str:
        total = len(self.importance) + len(self.missing)
        text = f"imatrix entries for {len(self.importance)} of {total} linears"
        if self.missing:
            text += (f"; no entry for {len(self.missing)} ({_few(self.missing)}): they are "
                     "quantised without importance")
        return text


def _few(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f", ... ({len(names) - n} more)" if len(names) > n else "")


@dataclass
class Imatrix:
    """entries: GGUF weight name -> statistics; datasets: the calibration text(s) named in the
    file; chunk_count / chunk_size: chunks processed and tokens per chunk (llama-imatrix's
    n_ctx); legacy: read from a .dat file."""

    entries: dict[str, ImatrixEntry]
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0
    legacy: bool = False
    source: str = ""

    def entry_for(self, linear: str, in_features: int) -> ImatrixEntry | None:
        """The entry of Hugging Face linear `linear` (None when the file has none); an
        ImatrixError when its length is not `in_features` or it holds experts."""
        gname = gguf_weight_name(linear)
        entry = self.entries.get(gname)
        if entry is None:
            return None
        where = f"imatrix entry {gname!r} (for {linear!r})" + (f" in {self.source}"
                                                             if self.source else "")
        if entry.n_mat != 1:
            raise ImatrixError(f"{where} holds {entry.n_mat} experts (a MoE weight); ArkInfer's "
                               "models have dense linears only", _REMAKE)
        if entry.n_in != in_features:
            raise ImatrixError(f"{where} has {entry.n_in} values but the layer has in_features="
                               f"{in_features}: the imatrix was made for another model", _REMAKE)
        return entry

    def importance(self, linear: str, in_features: int) -> torch.Tensor | None:
        """float32 [in_features]: the mean square of `linear`'s input columns (None: no entry)."""
        entry = self.entry_for(linear, in_features)
        return None if entry is None else torch.from_numpy(entry.mean_square()[0])

    def match(self, linears: dict[str, int]) -> ImatrixMatch:
        """Importance of every linear in `linears` (name -> in_features) that has an entry; an
        ImatrixError when a length does not match or when no linear has one (a file made for
        another model)."""
        found, missing, used = {}, [], set()
        for name, in_features in linears.items():
            imp = self.importance(name, in_features)
            if imp is None:
                missing.append(name)
            else:
                found[name] = imp
                used.add(gguf_weight_name(name))
        if linears and not found:
            raise ImatrixError(f"imatrix {self.source} has no entry for any of the {len(linears)} "
                               f"linears (it holds {len(self.entries)}, e.g. "
                               f"{_few(sorted(self.entries))})", _REMAKE)
        return ImatrixMatch(found, missing, sorted(set(self.entries) - used))


def read_imatrix(path: str | Path) -> Imatrix:
    """An imatrix file in either layout (GGUF when it starts with "GGUF", else legacy .dat)."""
    from arkinfer.paths import read_limited

    path = Path(path)
    data = read_limited(path, "imatrix file", MAX_BYTES, ImatrixError)
    where = f"imatrix file {path}"
    if data[:4] == GGUF_MAGIC:
        entries, meta = decode_gguf(data, where)
    else:
        try:
            entries, meta = decode_dat(data, where)
        except ImatrixError as exc:
            raise ImatrixError(f"{path} is neither a GGUF imatrix nor a legacy .dat imatrix "
                               f"({exc.message})", "give a file written by llama-imatrix or "
                               "arkinfer quantize --save-imatrix") from None
    if not entries:
        raise ImatrixError(f"{where} holds no importance data (no <name>.in_sum2 tensors)",
                           "the file is empty; write it again")
    return Imatrix({n: ImatrixEntry(s, c) for n, (s, c) in entries.items()}, meta["datasets"],
                   meta["chunk_count"], meta["chunk_size"], meta["legacy"], str(path))


def check_imatrix_path(path: str | Path, force: bool = False) -> Path:
    """`path` when an imatrix may be written there: not an existing file unless `force`, never
    an existing folder, FIFO or device."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise ImatrixError(f"imatrix output {path} cannot be written: {exc.strerror or exc}",
                           "choose another path") from None
    if not stat.S_ISREG(mode):
        raise ImatrixError(f"imatrix output {path} exists and is not a regular file",
                           "name a new file, e.g. --save-imatrix imatrix.gguf")
    if not force:
        raise ImatrixError(f"imatrix output {path} already exists",
                           "pass --force to replace it, or choose another name")
    return path


def write_imatrix(path: str | Path, imatrix: Imatrix, *, force: bool = False) -> Path:
    """Write `imatrix` to `path` (GGUF; the legacy layout when the name ends in .dat) through a
    temporary file in the same folder renamed over it. An existing file is refused unless
    `force`."""
    from arkinfer.frontend.shard_writer import honour_umask

    path = check_imatrix_path(path, force)
    entries = {n: (e.sums, e.counts) for n, e in imatrix.entries.items()}
    encode = encode_dat if path.suffix.lower() == ".dat" else encode_gguf
    data = encode(entries, list(imatrix.datasets), int(imatrix.chunk_count),
                  int(imatrix.chunk_size))
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        honour_umask(Path(tmp))
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise ImatrixError(f"cannot write the imatrix {path}: {exc.strerror or exc}",
                           "free disk space or choose a folder you can write to") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return path
