"""Decode-step agreement of an artifact's runtime with ArkInfer's reference model on the same
quantised weights (what verify's fidelity gate measures on prefill, here one token at a time).

A runtime may decode through other kernels than it prefills with: the tvm host build's decode
takes int16 (default) or int8 activations (kernels_qact.py), as llama.cpp takes int8 for every
quantised matmul. This feeds the same text to both (teacher forcing: prefill 8 tokens, then
decode each next token of the text) and reports top-1 agreement and |logit| differences per
step.

    .venv/bin/python benchmarks/decode_agreement.py ARTIFACT [ARTIFACT ...] [--json OUT]
        [--onnx-accuracy-level 4]    # onnx artifacts: MatMulNBits' int8 activations
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from machine import machine_info

from arkinfer.backend import get_backend
from arkinfer.pipeline.reference_runner import ReferenceRunner

TEXT = ("The history of bread goes back at least 30,000 years. Early humans made a flatbread from "
        "roasted grains and water. Later, people in Egypt learned that dough left out would rise, "
        "and leavened bread spread across the Mediterranean. Today bakers use flour, water, salt "
        "and yeast, and the methods differ from country to country; in France the baguette is a "
        "daily staple while in Germany dense rye loaves are common.")
PREFILL = 8


def agreement(artifact: Path, onnx_accuracy_level: int | None = None) -> dict:
    manifest = json.loads((artifact / "arkinfer.json").read_text())
    name = manifest["backend"]["name"]
    backend = get_backend(name)
    level = onnx_accuracy_level if name in ("onnx", "tensorrt") else None
    runner = backend.load(artifact) if level is None else \
        backend.load(artifact, accuracy_level=level)
    reference = ReferenceRunner(backend.reference_weights(artifact))
    ids = reference.tokenize(TEXT)
    a, b = runner.prefill(ids[:PREFILL]), reference.prefill(ids[:PREFILL])
    same, diffs = 0, []
    for token in ids[PREFILL:]:
        same += int(a.argmax() == b.argmax())
        diffs.append(float((a - b).abs().max()))
        a, b = runner.decode(token), reference.decode(token)
    steps = len(ids) - PREFILL
    return {"artifact": str(artifact), "backend": name, "onnx_accuracy_level": level,
            "notes": manifest["backend"].get("notes", []), "decode_steps": steps,
            "top1_agreement": same / steps, "max_abs_logit_diff": max(diffs),
            "mean_max_abs_logit_diff": sum(diffs) / steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifacts", nargs="+", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--onnx-accuracy-level", type=int, choices=(0, 1, 2, 3, 4),
                    help="onnx / tensorrt artifacts: MatMulNBits' accuracy_level (default: "
                         "the artifact's manifest, else 0)")
    args = ap.parse_args()
    load = os.getloadavg()
    rows = [agreement(a, args.onnx_accuracy_level) for a in args.artifacts]
    print("| artifact | backend | decode steps | top-1 agreement | max / mean max abs logit diff |")
    print("|---|---|---|---|---|")
    for r in rows:
        level = "" if r["onnx_accuracy_level"] is None else f" (level {r['onnx_accuracy_level']})"
        print(f"| {Path(r['artifact']).name} | {r['backend']}{level} | {r['decode_steps']} | "
              f"{r['top1_agreement']:.3f} | {r['max_abs_logit_diff']:.3f} / "
              f"{r['mean_max_abs_logit_diff']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "load_average_before": load,
                                         "text": TEXT, "prefill": PREFILL, "rows": rows},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
