"""Calibration data: which token sequences the calibrators see, chosen deterministically.

Default text: `arkinfer/data/corpus_train.txt`, short plain-English essays written for this
project by its contributors (no copied text; Apache-2.0 like ArkInfer; see arkinfer/data/README.md).
It is the training text of the demo model and is never used for evaluation:
`arkinfer/data/corpus_eval.txt` is held out for perplexity.

A `--calib FILE` is plain UTF-8 text, or JSON Lines (`.jsonl`) with a "text" field per record.
The texts are tokenised (no special tokens) and joined, separated by the tokenizer's EOS token
when it has one, into one token stream; `samples` windows of `seq_len` tokens start at offsets
drawn with `torch.Generator().manual_seed(seed)` (the GPTQ reference samples random windows the
same way). A stream shorter than `seq_len` gives one right-padded sequence with a mask.

`CalibData.sha256` hashes the token ids, the mask and the settings; it goes into the output's
recipe so a quantised model names exactly the data it was calibrated on.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from .weight import QuantError

DEFAULT_CALIB_TEXT = Path(__file__).resolve().parents[1] / "arkinfer" / "data" / "corpus_train.txt"


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


def read_texts(path: Path) -> list[str]:
    """Plain text -> [whole file]; .jsonl -> the "text" field of every record."""
    path = Path(path)
    if not path.is_file():
        raise QuantError(f"calibration file {str(path)!r} does not exist",
                         "pass --calib FILE (plain text or .jsonl with a 'text' field)")
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise QuantError(f"calibration file {path} is not UTF-8: {exc}",
                         "convert it to UTF-8") from None
    if path.suffix.lower() not in (".jsonl", ".ndjson"):
        return [raw]
    texts = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise QuantError(f"line {n} of {path} is not JSON: {exc}",
                             "write one JSON object per line") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise QuantError(f"line {n} of {path} has no string field 'text' (keys: "
                             f"{sorted(record) if isinstance(record, dict) else type(record).__name__})",
                             "give every record a 'text' field")
        texts.append(record["text"])
    if not texts:
        raise QuantError(f"{path} holds no records", "add lines like {\"text\": \"...\"}")
    return texts


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
                     max_positions: int | None = None, hidden_size: int | None = None
                     ) -> CalibData:
    """Tokenise the calibration text (default corpus_train.txt) and sample windows. With the
    model's `max_positions` and `hidden_size`, impossible sizes are refused before anything is
    read or allocated (`check_calibration_size`)."""
    check_calibration_size(samples, seq_len, max_positions, hidden_size)
    path = Path(path) if path is not None else DEFAULT_CALIB_TEXT
    texts = read_texts(path)
    stream: list[int] = []
    for i, text in enumerate(texts):
        if i and eos_id is not None:
            stream.append(eos_id)
        stream.extend(tokenizer.encode(text, add_special_tokens=False))
    ids, mask = sample_windows(stream, samples, seq_len, seed, pad_id=eos_id or 0)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    source = "corpus_train.txt (ArkInfer, Apache-2.0)" if path == DEFAULT_CALIB_TEXT else path.name
    settings = {"source": source, "source_sha256": digest, "records": len(texts),
                "stream_tokens": len(stream), "requested_samples": samples, "seed": seed}
    return CalibData(ids, mask, settings)


def calibration_from_ids(ids: torch.Tensor, mask: torch.Tensor | None = None,
                         source: str = "token ids") -> CalibData:
    """Calibration data from given token ids [N, T] (tests, programmatic use)."""
    ids = torch.as_tensor(ids, dtype=torch.int64)
    if ids.dim() != 2:
        raise QuantError(f"calibration ids have shape {tuple(ids.shape)}; expected [N, T]",
                         "stack the sequences into a 2-D tensor")
    mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.to(torch.bool)
    return CalibData(ids, mask, {"source": source})
