"""The real SmolLM2-135M-Instruct (imported from its GGUF) through the IR equals eager."""

from __future__ import annotations

import pytest
from ir_helpers import DECODE_STEPS, check_parity

from arkinfer import ir


@pytest.fixture(scope="module")
def smollm2():
    from arkinfer.testing.smollm2 import smollm2_hf_dir  # ships with the package: no skip

    try:
        folder = smollm2_hf_dir()
    except Exception as exc:  # noqa: BLE001 - any failure to obtain the model is a skip reason
        pytest.skip(f"SmolLM2 is not available here: {type(exc).__name__}: {exc}")
    from arkinfer.frontend.checkpoint import load_model, open_checkpoint

    return load_model(open_checkpoint(folder, with_tokenizer=False)), ir.trace(folder)


@pytest.mark.heavy
@pytest.mark.parametrize("stage", ["traced", "optimised"])
def test_smollm2_interpreter_equals_eager(smollm2, stage):
    model, program = smollm2
    if stage == "optimised":
        program = ir.run_passes(program)
    assert program.num_layers == 30
    for n in (1, 7, 64):
        check_parity(model, program, n, steps=DECODE_STEPS)
