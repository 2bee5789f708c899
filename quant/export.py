"""Write a calibrated model as a Hugging Face folder in a runtime's quantised layout.

    run = calibrate("./model", recipe, calib, work_dir)        # quant.calib.stream
    export_folder(run, "./model-gptq")                         # config.json, shards, summary

Layouts (docs/quant.md §6), tensor names `<linear>.<key>` with the keys of the format's `pack`:

- `gptq`   AutoGPTQ / GPTQModel v1: `.qweight .qzeros .scales .g_idx`;
           `quantization_config = {quant_method: "gptq", bits, group_size, sym, desc_act,
           static_groups, damp_percent, true_sequential, checkpoint_format: "gptq", lm_head,
           dynamic}` (vLLM gptq / gptq_marlin read bits, group_size, desc_act, sym, lm_head,
           dynamic, checkpoint_format; transformers reads the same plus damp_percent,
           true_sequential). A `quantize_config.json` with the same fields is written too.
- `marlin` `.B .s`; `{quant_method: "gptq", checkpoint_format: "marlin", is_marlin_format: true,
           bits: 4, group_size, sym: true, desc_act: false, lm_head}` (vLLM's marlin).
- `awq`    AutoAWQ GEMM: `.qweight .qzeros .scales`; `{quant_method: "awq", bits: 4, group_size,
           zero_point: true, version: "gemm", modules_to_not_convert}`.
- any other registered format: `{quant_method: "arkinfer", format, bits, group_size, sym, kind}`
           with the format's own packed tensors (loadable by `quant.load`; not a runtime layout).

Linears a format refuses or the recipe skips keep `<linear>.weight` (float) and are listed
(`dynamic` negative matches for gptq, `modules_to_not_convert` for awq). Every other tensor is
copied as-is in its source dtype; float tensors the calibration changed (AWQ's norm weights) are
written in the source dtype. One safetensors shard per decoder block plus one for the rest, an
index, the tokenizer files, and `quant_summary.json` (per-layer recipe and SNR, calibration hash,
timings, bits per weight, and `quality`: KL vs the float model, see `record_quality`). The
folder is built under a temporary name and renamed into place.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arkinfer.frontend.checkpoint import open_checkpoint
from arkinfer.frontend.safetensors_io import DTYPES
from arkinfer.frontend.shard_writer import save_safetensors
from arkinfer.lowering.tokenizer_files import copy_tokenizer_files
from arkinfer.output_folder import (MARKER, check_output, make_staging, remove_leftovers,
                                    remove_work_folder, replace_folder)
from arkinfer.owned_folder import file_hashes, record_files

from .calib.stream import CalibrationRun, block_file, load_weights, release_maps
from .formats import get_format
from .weight import QuantizedWeight

RUNTIME_LAYOUTS = ("gptq", "marlin", "awq")
SUMMARY_NAME = "quant_summary.json"


def quantization_config(fmt_name: str, sample: QuantizedWeight | None, run: CalibrationRun,
                        float_linears: list[str], lm_head: bool) -> dict[str, Any]:
    """config.json's quantization_config for `fmt_name` (see the module docstring)."""
    r, c = run.recipe, run.config
    bits = sample.bits if sample is not None else r.bits
    group = sample.group_size if sample is not None else r.group_size
    sym = sample.sym if sample is not None else r.sym
    if fmt_name == "gptq":
        dynamic = {f"-:{re.escape(n)}$": {} for n in float_linears}
        return {"quant_method": "gptq", "bits": bits, "group_size": group, "sym": sym,
                "desc_act": bool(c.get("act_order", False)),
                "static_groups": bool(c.get("static_groups", False)),
                "damp_percent": c.get("damp", 0.01),
                "true_sequential": bool(c.get("true_sequential", True)),
                "checkpoint_format": "gptq", "lm_head": lm_head, "dynamic": dynamic,
                "meta": _meta(run)}
    if fmt_name == "marlin":
        return {"quant_method": "gptq", "checkpoint_format": "marlin", "is_marlin_format": True,
                "bits": 4, "group_size": group, "sym": True, "desc_act": False,
                "lm_head": lm_head, "meta": _meta(run)}
    if fmt_name == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                "version": "gemm", "modules_to_not_convert": float_linears or None,
                "meta": _meta(run)}
    kind = str(sample.kind) if sample is not None else (
        "ternary" if r.calib == "ternary" else "uniform")
    return {"quant_method": "arkinfer", "format": fmt_name, "bits": bits, "group_size": group,
            "sym": sym, "kind": kind, "float_linears": float_linears, "lm_head": lm_head,
            "meta": _meta(run)}


def layer_formats(run: CalibrationRun, ckpt, tied: bool) -> dict[str, dict[str, Any]]:
    """{linear owner name: {format, bits, group_size, sym}} for every linear a per-layer override
    of the recipe stores in another format than the folder's (`quant.load` and the GGUF backend
    read it); the tied output layer is listed as `model.embed_tokens`."""
    owners = [r["name"] for b in run.blocks for r in b["linears"] if r["status"] == "quantised"]
    if run.tail is not None and run.tail.get("status") == "quantised":
        owners.append("lm_head")
    out = {}
    for owner in owners:
        sub = run.recipe.for_layer(owner)
        if sub is not run.recipe:
            key = "model.embed_tokens" if owner == "lm_head" and tied else owner
            out[key] = {"format": sub.format, "bits": sub.bits, "group_size": sub.group_size,
                        "sym": sub.sym}
    return out


def _meta(run: CalibrationRun) -> dict[str, Any]:
    """GPTQModel-style provenance (transformers' GPTQConfig keeps it in `meta`)."""
    from arkinfer import __version__

    return {"quantizer": [f"arkinfer:{__version__}"], "calibration": run.config["calib"],
            "calibration_sha256": run.calib.get("sha256")}


def _torch(arr: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(arr))


def quantised_record(folder: Path) -> dict[str, str | None] | None:
    """{relative path: sha256} of the files `folder`'s quant_summary.json lists (the summary
    itself with None); None when the folder has no summary with a `files` table (another kind of
    folder, or one exported before summaries listed their files)."""
    return record_files(folder / SUMMARY_NAME)


def check_quantised_output(out: Path, source: Path, *, force: bool) -> None:
    """Raise unless `quantize` may write `out`: --force replaces only an earlier quantised
    folder whose summary lists every file in it, unchanged (or an empty one), never the source
    model, the current folder or a parent of it."""
    check_output(out, force=force, what=f"ArkInfer quantised folder (with {SUMMARY_NAME} listing "
                 "its files)", record=quantised_record, protected=[(source, "the source model")])


def export_folder(run: CalibrationRun, out: str | Path, *, force: bool = False,
                  keep_work: bool = False) -> Path:
    """Write the quantised HF folder for `run` to `out` (see the module docstring)."""
    t0 = time.perf_counter()
    out = Path(out)
    check_quantised_output(out, run.source, force=force)
    remove_leftovers(out)
    ckpt = open_checkpoint(run.source, with_tokenizer=False)
    fmt = get_format(run.recipe.format)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_staging(out, "exporting")
    try:
        _write_folder(run, ckpt, fmt, tmp, t0)
        check_quantised_output(out, run.source, force=force)  # it may have changed meanwhile
        replace_folder(tmp, out)
    finally:
        remove_work_folder(tmp)  # gone already once it was swapped in
    if not keep_work:
        remove_work_folder(run.work_dir)
    return out


def _write_folder(run: CalibrationRun, ckpt, fmt, tmp: Path, t0: float) -> None:
    """Every file of the quantised folder into `tmp` (shards, config, index, tokenizer, summary)."""
    n = run.n_layers
    tail_q: dict[str, QuantizedWeight] = {}
    if run.tail is not None and run.tail.get("status") == "quantised":
        tail_q = load_weights(run.work_dir / "tail.safetensors")[0]
    head_names = [h for h in ckpt.weights.names() if h.startswith("lm_head.")]
    # A mixed-precision recipe (per-layer formats) budgets the tied output layer once: it is the
    # embedding, stored quantised and still tied. Otherwise a quantised lm_head is untied and the
    # embedding keeps its float weights (ternary or 4-bit input embeddings are not wanted there).
    tied = (bool(ckpt.raw_config.get("tie_word_embeddings")) and "lm_head" in tail_q
            and bool(run.recipe.layers) and fmt.name not in RUNTIME_LAYOUTS)
    tied_head = tail_q.pop("lm_head") if tied else None
    # shard 0: embeddings and the other small tensors; 1..n: the blocks; n+1: lm_head (apart
    # from the embeddings so export never holds both vocabulary-sized tensors at once)
    shard_count = n + 1 + bool(tail_q or head_names)
    names = [f"model-{i + 1:05d}-of-{shard_count:05d}.safetensors" for i in range(shard_count)]
    weight_map: dict[str, str] = {}
    stats = {"quantised_weights": 0, "packed_bytes": 0}
    float_linears: list[str] = []
    sample: QuantizedWeight | None = None

    def write(shard: int, tensors: dict[str, torch.Tensor]) -> None:
        save_safetensors(tensors, tmp / names[shard], {"format": "pt"})  # 0644, not 0600
        weight_map.update({k: names[shard] for k in tensors})
        tensors.clear()
        release_maps(ckpt)

    def pack(owner: str, qw: QuantizedWeight, tensors: dict[str, torch.Tensor],
             layer: str | None = None) -> None:
        """`owner`'s tensors, packed in the format the recipe gives linear `layer` (= owner)."""
        packed = get_format(run.recipe.for_layer(layer or owner).format).pack(qw)
        for key, arr in packed.items():
            tensors[f"{owner}.{key}"] = _torch(arr)
        stats["quantised_weights"] += qw.codes.numel()
        stats["packed_bytes"] += sum(a.nbytes for a in packed.values())

    first = {name: ckpt.weights.get(name) for name in ckpt.weights.names()
             if not name.startswith(("model.layers.", "lm_head."))}
    if tied:  # the tied output layer is the embedding: stored once, quantised, still tied
        del first["model.embed_tokens.weight"]
        pack("model.embed_tokens", tied_head, first, layer="lm_head")
    write(0, first)
    for i in range(n):
        quantized, floats, info = load_weights(block_file(run.work_dir, i))
        prefix = f"model.layers.{i}."
        tensors: dict[str, torch.Tensor] = {}
        for name in ckpt.weights.names():
            if not name.startswith(prefix):
                continue
            owner = name[: -len(".weight")] if name.endswith(".weight") else None
            if owner in quantized:
                pack(owner, quantized[owner], tensors)
                sample = sample or quantized[owner]
            elif name in floats:
                tensors[name] = floats[name].to(DTYPES[ckpt.weights.infos[name].dtype][0])
            else:
                tensors[name] = ckpt.weights.get(name)
        float_linears += [r["name"] for r in info["linears"] if r["status"] != "quantised"]
        write(i + 1, tensors)
        del quantized, floats
    if tail_q:
        last: dict[str, torch.Tensor] = {}
        pack("lm_head", tail_q["lm_head"], last)
        last.update({h: ckpt.weights.get(h) for h in head_names if h != "lm_head.weight"})
        write(n + 1, last)
    elif head_names:
        write(n + 1, {h: ckpt.weights.get(h) for h in head_names})
    raw = dict(ckpt.raw_config)
    lm_head = "lm_head" in tail_q or tied
    if lm_head and not tied and raw.get("tie_word_embeddings"):
        raw["tie_word_embeddings"] = False  # lm_head is now its own (quantised) tensor
    qcfg = quantization_config(fmt.name, sample, run, float_linears, lm_head)
    if run.recipe.layers:
        qcfg["layers"] = layer_formats(run, ckpt, tied)
    raw["quantization_config"] = qcfg
    _write_json(tmp / "config.json", raw)
    if fmt.name in ("gptq", "marlin"):
        _write_json(tmp / "quantize_config.json", qcfg)
    total = sum((tmp / f).stat().st_size for f in names)
    _write_json(tmp / "model.safetensors.index.json",
                {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    copy_tokenizer_files(run.source, tmp)
    summary = build_summary(run, fmt.name, qcfg, stats, float_linears)
    summary["timings"]["export_seconds"] = round(time.perf_counter() - t0, 3)
    summary["files"] = file_hashes(tmp, skip=(SUMMARY_NAME, MARKER))  # what --force may replace
    _write_json(tmp / SUMMARY_NAME, summary)

def build_summary(run: CalibrationRun, fmt_name: str, qcfg: dict, stats: dict,
                  float_linears: list[str]) -> dict[str, Any]:
    linears = [r for b in run.blocks for r in b["linears"]]
    snrs = [r["snr_db"] for r in linears if r["status"] == "quantised" and r["snr_db"] is not None]
    blocks = [b["block_snr_db"] for b in run.blocks if b.get("block_snr_db") is not None]
    bpw = 8 * stats["packed_bytes"] / stats["quantised_weights"] if stats["quantised_weights"] else None
    return {
        "source": str(run.source), "format": fmt_name, "recipe": run.recipe.describe(),
        "calibration_config": run.config, "calibration": run.calib,
        "calibration_sha256": run.calib.get("sha256"), "quantization_config": qcfg,
        "quantised_linears": sum(r["status"] == "quantised" for r in linears),
        "float_linears": float_linears,
        "bits_per_weight": None if bpw is None else round(bpw, 4),
        "mean_linear_snr_db": round(sum(snrs) / len(snrs), 3) if snrs else None,
        "min_linear_snr_db": min(snrs) if snrs else None,
        "mean_block_snr_db": round(sum(blocks) / len(blocks), 3) if blocks else None,
        "blocks": run.blocks, "lm_head": run.tail,
        # how predictions changed (KL etc. vs the float model): `record_quality`; null = not
        # measured (arkinfer quantize --no-kl)
        "quality": None,
        "timings": {"calibration_seconds": run.seconds,
                    "per_block_seconds": [b["seconds"] for b in run.blocks]},
        "calibration_device": run.device,
    }


def record_quality(folder: Path, quality: dict[str, Any]) -> dict[str, Any]:
    """Write `quality` (`arkinfer.pipeline.verify.quantisation_quality`: mean KL, top-1
    agreement and perplexity change against the float model on the verify prompts) into the
    folder's summary under `quality`; the summary lists itself without a hash, so the folder's
    file record stays valid. Returns the updated summary."""
    path = Path(folder) / SUMMARY_NAME
    summary = json.loads(path.read_text(encoding="utf-8"))
    summary["quality"] = quality
    _write_json(path, summary)
    return summary


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")

