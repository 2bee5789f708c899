"""SmolLM2-135M (the real model, 576-wide rows: group 32) as a Core ML package (heavy).

One RTN Q4_0 quantisation (g32, the canonical codes) is lowered twice: to Core ML, where the
codes become constexpr_blockwise_shift_scale, and to GGUF Q4_0 (the llama.cpp anchor). The
package must hold exactly those codes, its op set must be iOS 18's, the saved program (MIL
evaluator) must agree with ArkInfer's reference model on the same weights, and its size is
reported against the GGUF file's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

ct = pytest.importorskip("coremltools")

from arkinfer.backend import LowerRequest  # noqa: E402
from arkinfer.backends.coreml.backend import BACKEND  # noqa: E402
from arkinfer.backends.coreml.runner import PACKAGE, CoreMLRunner  # noqa: E402
from arkinfer.errors import NotAvailableError  # noqa: E402
from arkinfer.frontend.checkpoint import open_checkpoint  # noqa: E402
from arkinfer.quant import get_preset  # noqa: E402
from arkinfer.quant.load import load_quantized  # noqa: E402

pytestmark = pytest.mark.heavy


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() \
        else path.stat().st_size


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from arkinfer.quant.calib.weight_only import quantize_weight_only
    from arkinfer.quant.export import export_folder
    from arkinfer.testing.smollm2 import smollm2_hf_dir

    try:
        src = smollm2_hf_dir()
    except NotAvailableError as exc:
        pytest.skip(f"SmolLM2 not available: {exc}")
    work = tmp_path_factory.mktemp("smollm2-coreml")
    recipe = get_preset("q4_0")  # rtn 4-bit g32 sym -> gguf-q4_0
    run = quantize_weight_only(open_checkpoint(src), recipe, work / "calib")
    quantised = export_folder(run, work / "quantised")
    out = work / "coreml"
    result = BACKEND.lower(LowerRequest(quantised, src, recipe, "f32", None, out,
                                        options={"context": "512"}))
    return src, quantised, out, result, recipe


def test_package_checks_and_size_against_gguf_q4_0(built):
    import json

    src, quantised, out, result, recipe = built
    checks = json.loads((out / "coreml_checks.json").read_text())
    assert checks["weights"]["passed"] and checks["weights"]["checked"] == 2 * 30 * 7
    assert checks["opset"]["passed"]
    package = _size(out / PACKAGE)
    from arkinfer.backends.gguf.backend import BACKEND as GGUF

    if not GGUF.available():
        pytest.skip(f"the gguf backend is not installed here: {GGUF.install_hint()}")
    gguf_dir = out.parent / "gguf"
    GGUF.lower(LowerRequest(quantised, src, recipe, "f16", None, gguf_dir))
    gguf = _size(gguf_dir / "model.gguf")
    print(f"\nSmolLM2-135M q4_0 g32: Core ML package {package / 2**20:.1f} MiB, "
          f"GGUF Q4_0 {gguf / 2**20:.1f} MiB, ratio {package / gguf:.3f}")
    # Same codes; Core ML stores fp16 scales per 32 weights like Q4_0 and the embedding in fp16
    # (GGUF may quantise token_embd), so the package is at most ~1.5x the GGUF file.
    assert package < 1.5 * gguf


def test_saved_program_matches_the_reference_on_the_same_weights(built):
    src, quantised, out, _, _ = built
    runner = CoreMLRunner(out)
    ids = runner.tokenize("The capital of France is Paris. The capital of Germany is Berlin. "
                          "The capital of Italy is")
    got = runner.window_logits(ids)
    model = load_quantized(quantised)
    with torch.no_grad():
        want, _ = model(torch.tensor([ids]), torch.arange(len(ids)), model.empty_cache(1))
    want = want[0].float()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.95
