"""Calibration data: default text, plain / jsonl files, deterministic seeded windows, hash."""

from __future__ import annotations

import json

import pytest
import torch
from arkinfer.quant import QuantError
from arkinfer.quant.calib_data import (
    DEFAULT_CALIB_TEXT,
    calibration_from_ids,
    load_calibration,
    read_texts,
    sample_windows,
)


class CharTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % 256 for c in text]


def test_default_text_is_the_shipped_training_corpus():
    assert DEFAULT_CALIB_TEXT.name == "corpus_train.txt" and DEFAULT_CALIB_TEXT.is_file()
    data = load_calibration(CharTokenizer(), samples=4, seq_len=64, seed=1)
    assert data.ids.shape == (4, 64) and bool(data.mask.all())
    assert data.settings["source"].startswith("corpus_train.txt")
    text = DEFAULT_CALIB_TEXT.read_text()
    window = "".join(chr(i) for i in data.ids[0].tolist())
    assert window in text


def test_sampling_is_deterministic_and_seeded():
    a = load_calibration(CharTokenizer(), samples=8, seq_len=32, seed=3)
    b = load_calibration(CharTokenizer(), samples=8, seq_len=32, seed=3)
    c = load_calibration(CharTokenizer(), samples=8, seq_len=32, seed=4)
    assert torch.equal(a.ids, b.ids) and a.sha256 == b.sha256
    assert not torch.equal(a.ids, c.ids) and a.sha256 != c.sha256
    assert len(a.sha256) == 64 and a.describe()["sha256"] == a.sha256


def test_jsonl_and_short_text_padding(tmp_path):
    path = tmp_path / "calib.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in ["abc", "defg"]) + "\n\n")
    assert read_texts(path) == ["abc", "defg"]
    data = load_calibration(CharTokenizer(), path, samples=4, seq_len=16, eos_id=0)
    assert data.ids.shape == (1, 16)  # 8 tokens (with one EOS between records) < 16: one padded
    assert data.mask[0].tolist() == [True] * 8 + [False] * 8
    assert data.ids[0, :8].tolist() == [97, 98, 99, 0, 100, 101, 102, 103]


def test_bad_inputs_name_the_problem(tmp_path):
    with pytest.raises(QuantError, match="does not exist"):
        read_texts(tmp_path / "missing.txt")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"txt": "x"}\n')
    with pytest.raises(QuantError, match="line 1 .* no string field 'text'"):
        read_texts(bad)
    with pytest.raises(QuantError, match="samples=0"):
        sample_windows([1, 2, 3], 0, 8, 0)
    with pytest.raises(QuantError, match="expected \\[N, T\\]"):
        calibration_from_ids(torch.zeros(5, dtype=torch.long))
