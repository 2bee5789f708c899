"""Decode top-1 agreement of an onnx artifact with int8 activations (MatMulNBits
`accuracy_level` 4) on every linear but some roles, which keep fp32 activations (level 0): does
any mix keep agreement with the reference model while running most of the step in int8?

    .venv/bin/python benchmarks/onnx_mixed_levels.py ART [--fp32 none qkv,o gu,down ...]
        [--texts benchmarks/data/dev/*.txt] [--tokens 300] [--json OUT]

ART: `arkinfer build SMOLLM2 --target host --backend onnx --quant gptq`. Roles, in the order the
host graph holds each layer's MatMulNBits nodes: qkv (packed q/k/v), o, gu (packed gate/up),
down; `all` keeps every role at level 0. Teacher forcing as benchmarks/decode_agreement.py: a
prefill of 8 tokens, then each next token of each text (its first --tokens tokens); the rewritten
graph is built in memory (the host-graph cache is not used).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from machine import machine_info

ROLES = ("qkv", "o", "gu", "down")


def _with_fp32_roles(roles: set[str]):
    """contrib.use_matmul_nbits at level 4, then level 0 on the nodes of `roles`."""
    from arkinfer.backends.onnx import contrib

    original = contrib.use_matmul_nbits

    def rewrite(model, accuracy_level=0):
        result = original(model, accuracy_level=4)
        nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
        for i, node in enumerate(nodes):
            if ROLES[i % len(ROLES)] in roles:
                for attr in node.attribute:
                    if attr.name == "accuracy_level":
                        attr.i = 0
        return result

    return original, rewrite


def agreement(artifact: Path, roles: set[str], texts: list[Path], tokens: int) -> dict:
    from arkinfer.backend import get_backend
    from arkinfer.backends.onnx import host_graph
    from arkinfer.backends.onnx.runner import OnnxRunner
    from arkinfer.pipeline.reference_runner import ReferenceRunner

    original, rewrite = _with_fp32_roles(roles)
    host_graph.contrib.use_matmul_nbits = rewrite
    try:
        runner = OnnxRunner(artifact, accuracy_level=4, cache=False)
    finally:
        host_graph.contrib.use_matmul_nbits = original
    reference = ReferenceRunner(get_backend("onnx").reference_weights(artifact))
    same = steps = 0
    margins = []
    for text in texts:
        ids = reference.tokenize(text.read_text(encoding="utf-8")[:3000])[:tokens]
        runner.reset()
        reference.reset()
        a, b = runner.prefill(ids[:8]), reference.prefill(ids[:8])
        for token in ids[8:]:
            if int(a.argmax()) == int(b.argmax()):
                same += 1
            else:
                top = b.flatten().topk(2).values
                margins.append(round(float(top[0] - top[1]), 3))
            steps += 1
            a, b = runner.decode(token), reference.decode(token)
    return {"fp32_roles": sorted(roles), "steps": steps, "top1_agreement": same / steps,
            "reference_top2_margins_at_flips": margins}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--fp32", nargs="+", default=["none", "down", "gu,down", "all"])
    ap.add_argument("--texts", nargs="+", type=Path,
                    default=sorted(Path(__file__).parent.joinpath("data", "dev").glob("*.txt")))
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    load_before = list(os.getloadavg())
    rows = []
    for spec in args.fp32:
        roles = set(ROLES) if spec == "all" else set() if spec == "none" else set(spec.split(","))
        row = agreement(args.artifact, roles, args.texts, args.tokens)
        print(f"fp32 roles {spec}: top-1 {row['top1_agreement']:.3f} over {row['steps']} steps")
        rows.append(row)
    if args.json:
        out = {"machine": machine_info(), "load_average_before": load_before,
               "artifact": str(args.artifact), "texts": [str(t) for t in args.texts],
               "rows": rows}
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
