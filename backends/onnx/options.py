"""The onnx (and tensorrt) backend's `--option KEY=VALUE`s.

accuracy_level: the compute precision of the host runner's 4-bit MatMulNBits, stored in the
graph's metadata (`host_graph.ACCURACY_LEVEL_KEY`) so every later load (verify, bench, run,
serve) uses it. 0 keeps fp32 activations, the reference model's numbers; 4 quantises the
activations to int8 per block and uses integer dot products, as llama.cpp does on CPUs: on
SmolLM2, 1.13x llama.cpp's Q4_0 decode on an AVX2-only AMD Zen 3 where 0 gives 0.46x, with 2 of
85 greedy decode tokens differing from the reference (BENCHMARKS.md, "ONNX Runtime host decode").
"""

from __future__ import annotations

from arkinfer.backend import BackendOption

OPTIONS = {
    "accuracy_level": BackendOption(
        "host runner's 4-bit matmul activations: 0 fp32 (default, the reference's tokens), "
        "4 int8 (faster, above all on AVX2-only CPUs; some greedy tokens differ)",
        ("0", "4"), example="4"),
}
