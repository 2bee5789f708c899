"""A draft carried by an artifact (`arkinfer build ... --draft SOURCE [--draft-vocab K]`).

    check_draft_request("eagle3:demo", 512, raw_config, "gguf")  # at plan time, before any work
    record = write_draft("eagle3:demo", 512, checkpoint, None, staging, step)  # during build
    draft = artifact_draft(artifact_dir, manifest, target_runner)  # run / serve / bench / verify

What the artifact holds, by kind (manifest["draft"]):
- "eagle3": the head written into `draft/` (config.json, model.safetensors; its `bytes`
  recorded here, not in memory.weights_bytes, which counts the target) in bfloat16, not
  quantised: a head GPTQ'd like the target loses accepted length (the MiniCPM4 report trains its
  draft with quantisation-aware training instead); bf16 halves what a draft step reads against
  float32 (an 8B model's head is ~0.5 G weights, most of them its LM head). With
  `--draft-vocab K` (FR-Spec) the head's LM head keeps the K ids most frequent in the calibration
  text, counted with the model's tokenizer; the counts are stored in `draft/token_frequencies.json`.
- "lookup" and "self": no files; the record names the draft, which run / serve use by default.
- "model": another artifact used as the draft; its path and manifest hash are recorded (the
  folder is not copied).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from arkinfer.errors import ArkError

from . import manifest as mf
from .draft import DRAFT_FORMS, eagle3_draft, head_path, parse_draft, self_layers

DRAFT_DIR = "draft"
FREQUENCIES = "token_frequencies.json"
WEIGHTS_NOTE = ("bfloat16, not quantised: GPTQ on a draft head lowers its accepted length (the "
                "MiniCPM4 report quantises its draft with QAT instead); computed in float32")


#: backends whose runners draft from the target's own layers (self:N and EAGLE-3 heads' taps), on
#: dense and InfLLM v2 (sparse_config) models alike
LAYER_DRAFT_BACKENDS = ("gguf", "mlx", "onnx", "reference")


def check_draft_request(spec: str | None, draft_vocab: int | None, raw: dict,
                        backend: str | None = None) -> None:
    """Refuse a draft that cannot work with the model `raw` (its config.json) on `backend` before
    any work: an unknown form, self:N outside 1..L-1, a head whose vocabulary, width or tap
    layers do not fit, self:N or a head on a backend whose runner cannot run them, --draft-vocab
    without a head or outside 1..V."""
    from arkinfer.speculative.self_draft import check_layers

    vocab, layers = int(raw.get("vocab_size") or 0), int(raw.get("num_hidden_layers") or 0)
    if spec is None:
        if draft_vocab is not None:
            raise ArkError("--draft-vocab needs a draft head", hint="add --draft eagle3:HEAD")
        return
    head = head_path(spec)
    if draft_vocab is not None and head is None:
        raise ArkError(f"--draft-vocab restricts an EAGLE-3 head's LM head; --draft {spec!r} has "
                       "none", hint="drop --draft-vocab, or draft with an EAGLE-3 head")
    if draft_vocab is not None and not 1 <= draft_vocab <= vocab:
        raise ArkError(f"--draft-vocab {draft_vocab} is outside the model's vocabulary of {vocab}"
                       " tokens", hint=f"--draft-vocab K must be 1..{vocab} (FR-Spec uses 25-45 %"
                       f" of it, e.g. {max(1, vocab * 3 // 10)})")
    if spec == "lookup":
        return
    if backend is not None and (head is not None or spec.startswith("self:")):
        if backend not in LAYER_DRAFT_BACKENDS:
            raise ArkError(f"--draft {spec!r} runs inside the target's runtime, and the {backend} "
                           "backend's runner cannot run it (it exposes no layers or hidden "
                           "states)", hint=f"use --draft lookup, or --backend "
                           f"{' / '.join(LAYER_DRAFT_BACKENDS)}")
    if spec.startswith("self:"):
        check_layers(self_layers(spec), layers, "the model")
        return
    if head is not None:
        from arkinfer.speculative.eagle3_head import load_eagle3

        if not head.is_dir():
            raise ArkError(f"--draft {spec!r}: no such folder", hint="give the folder of an "
                           "EAGLE-3 head (config.json + model.safetensors)")
        load_eagle3(head, target_vocab_size=vocab, target_hidden_size=raw.get("hidden_size"),
                    target_layers=layers)  # strict: shapes, vocabulary, taps
        return
    from .artifact import is_artifact

    if not is_artifact(Path(spec)):
        raise ArkError(f"--draft {spec!r} is not a draft: use {DRAFT_FORMS}",
                       hint="e.g. --draft lookup, or --draft dist/small.host.q4_0")


def write_draft(spec: str | None, draft_vocab: int | None, checkpoint, calib_path,
                staging: Path, step: Callable[[str], None]) -> dict[str, Any] | None:
    """Put the draft `spec` into the artifact being built in `staging`; its manifest record."""
    if spec is None:
        return None
    head = head_path(spec)
    if head is not None:
        return _write_head(spec, head, draft_vocab, checkpoint, calib_path, staging, step)
    if spec == "lookup":
        return {"source": spec, "kind": "lookup", "folder": None}
    if spec.startswith("self:"):
        return {"source": spec, "kind": "self", "folder": None, "layers": self_layers(spec)}
    folder = Path(spec).resolve()
    return {"source": spec, "kind": "model", "folder": None, "path": str(folder),
            "manifest_sha256": mf.sha256_file(folder / mf.MANIFEST_NAME)}


def _write_head(spec: str, head_dir: Path, draft_vocab: int | None, checkpoint, calib_path,
                staging: Path, step: Callable[[str], None]) -> dict[str, Any]:
    from arkinfer.speculative.eagle3_head import load_eagle3, save_eagle3

    out = staging / DRAFT_DIR
    record: dict[str, Any] = {"source": spec, "kind": "eagle3", "folder": DRAFT_DIR,
                              "weights": WEIGHTS_NOTE}
    head = load_eagle3(head_dir, target_vocab_size=checkpoint.config.vocab_size)
    if draft_vocab is not None:
        from arkinfer.speculative.frspec import (
            frequent_vocabulary,
            restrict_head,
            token_frequencies,
        )

        step(f"FR-Spec: counting tokens of the calibration text for --draft-vocab {draft_vocab}")
        streams, source = calibration_streams(checkpoint, calib_path)
        freq = token_frequencies(streams, checkpoint.config.vocab_size)
        eos = checkpoint.config.eos_token_id
        stops = eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else []
        keep = frequent_vocabulary(freq, draft_vocab, always=stops)
        head = restrict_head(head, keep)
    save_eagle3(head, out, dtype=torch.bfloat16)
    if draft_vocab is not None:
        (out / FREQUENCIES).write_text(json.dumps({
            "text": source, "tokens": int(freq.sum()), "counts": freq.tolist()}) + "\n")
        record["frequencies"] = {"file": f"{DRAFT_DIR}/{FREQUENCIES}", "text": source,
                                 "tokens": int(freq.sum())}
    cfg = head.config
    record.update(vocab_size=cfg.vocab_size, draft_vocab_size=cfg.draft_vocab_size,
                  tap_layers=list(cfg.tap_layers), hidden_size=cfg.hidden_size,
                  bytes=sum(p.stat().st_size for p in out.iterdir() if p.is_file()))
    return record


def calibration_streams(checkpoint, calib_path) -> tuple[list[list[int]], str]:
    """The calibration text (`--calib`; None: the built-in corpus) as one token stream per
    domain, tokenised with the model's tokenizer; and the name of that text."""
    from arkinfer.quant.calib_corpus import calibration_domains, chat_renderer
    from arkinfer.quant.calib_data import domain_stream

    if str(calib_path) == "self":
        raise ArkError("--draft-vocab counts token frequencies in fixed calibration text; "
                       "--calib self has none before calibration", hint="drop --calib self, "
                       "or give --calib FILE|DIR")
    render = chat_renderer(checkpoint.tokenizer)
    streams = [domain_stream(d, render, checkpoint.tokenizer, None)
               for d in calibration_domains(calib_path)]
    return streams, "builtin" if calib_path is None else str(calib_path)


def artifact_draft(artifact: Path, manifest: dict, target):
    """The draft the artifact carries, for `target` (its runner), or None when it has none."""
    record = manifest.get("draft")
    if not record:
        return None
    if record["kind"] == "eagle3":
        return eagle3_draft(Path(artifact) / record["folder"], target)
    if record["kind"] == "model":
        return parse_draft(record["path"], target)
    return parse_draft(record["source"], target)
