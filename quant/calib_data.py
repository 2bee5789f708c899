"""Calibration data: which token sequences the calibrators see, chosen deterministically.

Default text: the built-in multi-domain corpus (`quant.calib_corpus`: prose, chat, code,
technical, legal, math, Chinese, Spanish/German/Italian; every file written for ArkInfer or
under a licence recorded in arkinfer/data/calib/README.md). `--calib prose` is the old
default, corpus_train.txt alone (the demo model's training text); `--calib FILE` one file;
`--calib DIR` one domain per file; `--calib self` text the model samples itself
(`quant.calib_self`: one domain per seed kind, its token ids used as generated, cached per
model and seed). None of it is evaluation text: perplexity is measured on held-out text
(benchmarks/data/heldout/, arkinfer/data/corpus_eval.txt).

Each domain's texts are tokenised (no special tokens; chats through the chat template) and
joined, separated by the tokenizer's EOS token when it has one, into one token stream. The
`samples` windows of `seq_len` tokens are dealt to the domains in turn (domain i gets window i,
i + D, ..., and `CalibData.ids` holds them in that order, so its first rows span every domain),
each domain's windows start at offsets drawn with
`torch.Generator().manual_seed(seed + i)` (the GPTQ reference samples random windows the same
way). A stream shorter than `seq_len` gives one right-padded sequence with a mask.

`CalibData.sha256` hashes the token ids, the mask and the settings; it goes into the output's
recipe so a quantised model names exactly the data it was calibrated on. The settings record the
mix: every domain with its windows (`samples`), stream length and text sha256; for `self` also
`generation` (model hash, seed prompts, temperature, top-p).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from arkinfer.text_pieces import tokenize_pieces

from .calib_corpus import (
    CALIB_MAX_BYTES,
    NAMED,
    PROSE_TEXT,
    SELF,
    Domain,
    calibration_domains,
    chat_renderer,
    is_self,
    read_texts,
)
from .weight import QuantError

__all__ = [
    "CALIB_MAX_BYTES",
    "PROSE_TEXT",
    "CalibData",
    "calibration_from_ids",
    "calibration_of",
    "check_calibration_size",
    "load_calibration",
    "read_texts",
    "sample_windows",
]


class _Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


@dataclass(frozen=True)
class CalibData:
    """ids int64 [N, T]; mask bool [N, T] (False = padding); settings: how they were made."""

    ids: torch.Tensor
    mask: torch.Tensor
    settings: dict = field(default_factory=dict)

    @property
    def samples(self) -> int:
        return int(self.ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.ids.shape[1])

    @property
    def tokens(self) -> int:
        return int(self.mask.sum())

    @property
    def sha256(self) -> str:
        h = hashlib.sha256()
        h.update(self.ids.to(torch.int64).contiguous().numpy().astype("<i8").tobytes())
        h.update(self.mask.to(torch.uint8).contiguous().numpy().tobytes())
        h.update(json.dumps(self.settings, sort_keys=True).encode())
        return h.hexdigest()

    def describe(self) -> dict:
        return {**self.settings, "samples": self.samples, "seq_len": self.seq_len,
                "tokens": self.tokens, "sha256": self.sha256}


def sample_windows(stream: list[int], samples: int, seq_len: int, seed: int,
                   pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`samples` windows of `seq_len` tokens at seeded random offsets -> (ids, mask)."""
    check_calibration_size(samples, seq_len)
    if not stream:
        raise QuantError("the calibration text is empty after tokenisation",
                         "give a non-empty --calib file")
    if len(stream) <= seq_len:
        ids = torch.full((1, seq_len), pad_id, dtype=torch.int64)
        ids[0, :len(stream)] = torch.tensor(stream)
        mask = torch.zeros(1, seq_len, dtype=torch.bool)
        mask[0, :len(stream)] = True
        return ids, mask
    data = torch.tensor(stream, dtype=torch.int64)
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - seq_len + 1, (samples,), generator=gen)
    ids = torch.stack([data[s:s + seq_len] for s in starts.tolist()])
    return ids, torch.ones_like(ids, dtype=torch.bool)


# Calibration holds a few [samples, seq_len, hidden] float32 activations at once (the block's
# inputs, outputs and reference outputs; quant/calib/stream.py), plus int64 ids and a bool mask.
ACTIVATION_COPIES = 4


def check_calibration_size(samples: int, seq_len: int, max_positions: int | None = None,
                           hidden_size: int | None = None) -> None:
    """Raise QuantError, before anything is allocated, when the windows are impossible: fewer than
    1 sample of 2 tokens, longer than the model's `max_position_embeddings`, or activations
    larger than the memory available now (psutil)."""
    if samples < 1 or seq_len < 2:
        raise QuantError(f"samples={samples}, seq_len={seq_len}: need at least 1 sample of at "
                         "least 2 tokens", "pass --samples N (>= 1) and --seq-len L (>= 2)")
    if max_positions is not None and seq_len > max_positions:
        raise QuantError(f"--seq-len {seq_len} exceeds the model's max_position_embeddings="
                         f"{max_positions}", f"use --seq-len {min(512, max_positions)} (at most "
                         f"{max_positions})")
    if hidden_size is not None:
        from arkinfer.frontend.checkpoint import check_memory

        check_memory(samples * seq_len * (ACTIVATION_COPIES * 4 * hidden_size + 9),
                     f"calibration with --samples {samples} x --seq-len {seq_len} (hidden_size "
                     f"{hidden_size}, activations)", QuantError,
                     "lower --samples or --seq-len (e.g. --samples 128 --seq-len 512)")


def load_calibration(tokenizer: _Tokenizer, path: str | Path | None = None, samples: int = 128,
                     seq_len: int = 512, seed: int = 0, eos_id: int | None = None, *,
                     max_positions: int | None = None, hidden_size: int | None = None,
                     checkpoint=None, progress: Callable[[str], None] | None = None
                     ) -> CalibData:
    """Tokenise the calibration text (`path`: None = the built-in corpus, "prose", a file or a
    folder; `quant.calib_corpus`) and sample windows from every domain alike. With the model's
    `max_positions` and `hidden_size`, impossible sizes are refused before anything is read or
    allocated (`check_calibration_size`).

    `path="self"`: text the model writes (`quant.calib_self`), which needs `checkpoint` (the
    opened model); `progress(line)` hears its sampling progress and cache notes; the settings
    then hold a `generation` record (model hash, seed prompts, temperature)."""
    check_calibration_size(samples, seq_len, max_positions, hidden_size)
    generation = None
    if is_self(path):
        if checkpoint is None:
            raise QuantError("--calib self samples the model itself, but this caller gave "
                             "calibration no model", "use `arkinfer quantize MODEL --calib self`"
                             " (in code: load_calibration(..., checkpoint=open_checkpoint(MODEL)))"
                             ", or name a calibration file")
        from .calib_self import DOMAINS as SELF_DOMAINS
        from .calib_self import self_domains

        builtin = [] if str(path) == SELF else calibration_domains(None)
        mixed = len(builtin) + len(SELF_DOMAINS)  # windows dealt over both, in turn
        own = samples if not builtin else sum(len(range(i, samples, mixed))
                                              for i in range(len(builtin), mixed))
        sampled, generation = (self_domains(checkpoint, own, seq_len, seed, progress) if own
                               else ([], None))
        domains = builtin + sampled
    else:
        domains = calibration_domains(path)
    render = chat_renderer(tokenizer)
    used = domains[:samples]  # fewer windows than domains: the first ones, in the corpus order
    parts, mask_parts, records = [], [], []
    for i, domain in enumerate(used):
        stream = domain_stream(domain, render, tokenizer, eos_id)
        count = len(range(i, samples, len(used)))
        ids, mask = sample_windows(stream, count, seq_len, seed + i, pad_id=eos_id or 0)
        parts.append(ids)
        mask_parts.append(mask)
        records.append({"domain": domain.name, "file": domain.path.name,
                        "sha256": domain.sha256, "stream_tokens": len(stream),
                        "samples": int(ids.shape[0])})
    ids, mask = interleave(parts), interleave(mask_parts)
    source = "builtin" if path is None else str(path)
    if len(domains) == 1 and path is not None and str(path) not in NAMED and generation is None:
        source = domains[0].path.name
    digest = hashlib.sha256("".join(d.sha256 for d in domains).encode()).hexdigest()
    settings = {"source": source, "source_sha256": digest, "domains": records,
                "requested_samples": samples, "seed": seed}
    if generation is not None:
        settings["generation"] = generation
    return CalibData(ids, mask, settings)


def calibration_of(checkpoint, path: str | Path | None, samples: int, seq_len: int, seed: int = 0,
                   progress: Callable[[str], None] | None = None) -> CalibData:
    """`load_calibration` for an opened checkpoint (`frontend.checkpoint.open_checkpoint`): its
    tokenizer, its first EOS id as the separator and pad, its context and hidden sizes for the
    size check, and the checkpoint itself for `--calib self`. `arkinfer quantize` and `build`
    both calibrate through this."""
    if checkpoint.tokenizer is None:
        raise QuantError(f"{checkpoint.path} has no tokenizer.json; calibration text must be "
                         "tokenised", "add the model's tokenizer.json to the folder")
    eos = checkpoint.config.eos_token_id
    eos = eos[0] if isinstance(eos, list) and eos else eos
    return load_calibration(checkpoint.tokenizer, path, samples, seq_len, seed,
                            eos if isinstance(eos, int) else None,
                            max_positions=checkpoint.config.max_position_embeddings,
                            hidden_size=checkpoint.config.hidden_size, checkpoint=checkpoint,
                            progress=progress)


def interleave(parts: list[torch.Tensor]) -> torch.Tensor:
    """Rows of the per-domain tensors `parts` (domain i: the windows i, i + D, ...; D = len(parts),
    so the counts differ by at most one, larger first) in window order: row j is from domain
    j mod D. Every leading slice of the result then covers the domains evenly, so a calibrator
    that reads only the first windows (AWQ's searches, the mixed-precision sensitivity) sees
    the whole mix rather than its first domains."""
    offsets = [0]
    for part in parts[:-1]:
        offsets.append(offsets[-1] + part.shape[0])
    total = sum(part.shape[0] for part in parts)
    order = [offsets[j % len(parts)] + j // len(parts) for j in range(total)]
    return torch.cat(parts)[order]


def domain_stream(domain: Domain, render, tokenizer: _Tokenizer, eos_id: int | None) -> list[int]:
    """A domain's token stream: its sequences as they are when it has ids (each sample of
    `--calib self` already starts with its prompt and ends at its stop token), else its texts
    tokenised and joined by `_stream`."""
    if domain.ids is not None:
        return [t for seq in domain.ids for t in seq]
    return _stream(domain.texts(render), tokenizer, eos_id)


def _stream(texts: list[str], tokenizer: _Tokenizer, eos_id: int | None) -> list[int]:
    stream: list[int] = []
    for i, text in enumerate(texts):
        if i and eos_id is not None:
            stream.append(eos_id)
        for ids in tokenize_pieces([text], lambda t: tokenizer.encode(t, add_special_tokens=False)):
            stream.extend(ids)  # piece by piece: a whole-file encoding costs ~185 bytes per byte
    return stream


def calibration_from_ids(ids: torch.Tensor, mask: torch.Tensor | None = None,
                         source: str = "token ids") -> CalibData:
    """Calibration data from given token ids [N, T] (tests, programmatic use)."""
    ids = torch.as_tensor(ids, dtype=torch.int64)
    if ids.dim() != 2:
        raise QuantError(f"calibration ids have shape {tuple(ids.shape)}; expected [N, T]",
                         "stack the sequences into a 2-D tensor")
    mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.to(torch.bool)
    return CalibData(ids, mask, {"source": source})
