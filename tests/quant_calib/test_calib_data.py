"""Calibration data: default text, plain / jsonl files, deterministic seeded windows, hash."""

from __future__ import annotations

import json

import pytest
import torch
from arkinfer.quant import QuantError
from arkinfer.quant.calib_corpus import BUILTIN
from arkinfer.quant.calib_data import (
    PROSE_TEXT,
    calibration_from_ids,
    load_calibration,
    read_texts,
    sample_windows,
)


class CharTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % 256 for c in text]


def test_default_text_is_every_domain_of_the_builtin_corpus():
    data = load_calibration(CharTokenizer(), samples=len(BUILTIN) * 2, seq_len=64, seed=1)
    assert data.ids.shape == (2 * len(BUILTIN), 64) and bool(data.mask.all())
    assert data.settings["source"] == "builtin"
    domains = data.settings["domains"]
    assert [d["domain"] for d in domains] == list(BUILTIN)
    assert all(d["samples"] == 2 for d in domains)
    for j, name in enumerate(list(BUILTIN) * 2):  # row j is from domain j mod D
        assert _domain_of(data.ids[j]) == name, j


def _domain_of(window) -> str:
    """The built-in domain whose text holds the longest piece of `window` (CharTokenizer ids;
    chats as read_texts renders them without a template)."""
    text = "".join(chr(i) for i in window.tolist())
    pieces = [text[k:k + 24] for k in range(0, len(text) - 24, 8)]
    corpus = {name: "".join(chr(i) for i in CharTokenizer().encode("\n".join(read_texts(path))))
              for name, path in BUILTIN.items()}
    return max(corpus, key=lambda name: sum(p in corpus[name] for p in pieces))


def test_the_first_windows_span_every_domain():
    """AWQ's searches and the mixed-precision sensitivity read the first windows only."""
    data = load_calibration(CharTokenizer(), samples=20, seq_len=64, seed=1)
    assert [_domain_of(data.ids[j]) for j in range(len(BUILTIN))] == list(BUILTIN)
    assert [d["samples"] for d in data.settings["domains"]] == [3, 3] + [2] * (len(BUILTIN) - 2)


def test_prose_is_the_demo_models_training_corpus_alone():
    assert PROSE_TEXT.name == "corpus_train.txt" and PROSE_TEXT.is_file()
    data = load_calibration(CharTokenizer(), "prose", samples=4, seq_len=64, seed=1)
    assert [d["domain"] for d in data.settings["domains"]] == ["prose"]
    window = "".join(chr(i) for i in data.ids[3].tolist())
    assert window in PROSE_TEXT.read_text()


def test_a_folder_is_one_domain_per_file_and_chats_render_through_the_template(tmp_path):
    (tmp_path / "a.txt").write_text("alpha " * 40)
    (tmp_path / "b.jsonl").write_text(json.dumps(
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
        + "\n")

    class Templated(CharTokenizer):
        chat_template = "x"

        def render_chat(self, messages, add_generation_prompt=True):
            assert add_generation_prompt is False
            return "".join(f"<{m['role']}>{m['content']}" for m in messages)

    data = load_calibration(Templated(), tmp_path, samples=2, seq_len=32, eos_id=0)
    assert [d["domain"] for d in data.settings["domains"]] == ["a", "b"]
    b = "".join(chr(i) for i, keep in zip(data.ids[1].tolist(), data.mask[1].tolist()) if keep)
    assert b == "<user>hi<assistant>yo"
    assert read_texts(tmp_path / "b.jsonl") == ["user: hi\nassistant: yo"]  # no template


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
    with pytest.raises(QuantError, match="line 1 .* neither a string 'text' nor a 'messages'"):
        read_texts(bad)
    with pytest.raises(QuantError, match="samples=0"):
        sample_windows([1, 2, 3], 0, 8, 0)
    with pytest.raises(QuantError, match="expected \\[N, T\\]"):
        calibration_from_ids(torch.zeros(5, dtype=torch.long))


def test_calibration_development_and_held_out_texts_share_no_passage():
    """Calibration, the texts recipes are chosen on, and the texts quality is reported on are
    three disjoint sets (benchmarks/quant_quality.py): no 8-word run (10 characters for Chinese)
    appears in two of them."""
    from pathlib import Path

    from arkinfer.quant.calib_corpus import BUILTIN

    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
    sets = {"calibration": list(BUILTIN.values()),
            "dev": [*sorted((bench / "dev").glob("*.txt")),
                    BUILTIN["prose"].with_name("corpus_eval.txt")],
            "heldout": sorted((bench / "heldout").glob("*.txt"))}

    def runs(paths) -> set[str]:
        out = set()
        for path in paths:
            text = path.read_text(encoding="utf-8")
            words = text.split()
            out |= {" ".join(words[i:i + 8]) for i in range(len(words) - 7)}
            cjk = "".join(c for c in text if "\u4e00" <= c <= "\u9fff")
            out |= {cjk[i:i + 10] for i in range(len(cjk) - 9)}
        return out

    seen = {name: runs(paths) for name, paths in sets.items()}
    # Licences borrow each other's clauses: Apache-2.0 (calibration) and GPL-3 (held out) share
    # one patent-litigation phrase and one cure-period phrase, 7 runs of 8 words in all.
    legal = runs([BUILTIN["legal"]]) & runs([bench / "heldout" / "legal.txt"])
    assert len(legal) <= 10, sorted(legal)
    for a, b in (("calibration", "dev"), ("calibration", "heldout"), ("dev", "heldout")):
        shared = (seen[a] & seen[b]) - legal
        assert not shared, f"{a} and {b} share {len(shared)} passages, e.g. {sorted(shared)[:3]}"
