"""InfLLM v2 through the tvm backend: a tiny MiniCPM4 with a sparse_config lowered by the backend
(`BACKEND.lower`, host build only), loaded by its Runner, against ArkInfer's reference model on
the same float weights (which runs `arkinfer.ops.infllmv2.reference` past dense_len). The kernels
themselves are checked op by op in tests/conformance (`-k tvm`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from arkinfer.backend import LowerRequest, get_backend

BACKEND = get_backend("tvm")
if not BACKEND.available():
    pytest.skip(f"tvm is not installed: {BACKEND.install_hint()}", allow_module_level=True)

from arkinfer.pipeline.reference_runner import ReferenceRunner  # noqa: E402
from arkinfer.testing.runners import greedy_tokens  # noqa: E402

# Blocks of 16, budget 6 blocks (96 keys), dense below 150 tokens: a tiny model runs sparse
# within 200 tokens (the config the MLX runtime tests use).
SMALL_SPARSE = {"kernel_size": 8, "kernel_stride": 4, "block_size": 16, "init_blocks": 1,
                "window_size": 32, "topk": 4, "use_nope": False, "dense_len": 150}


@pytest.fixture(scope="module")
def sparse_model(tmp_path_factory) -> tuple[Path, Path]:
    """(float HF folder, tvm artifact): tiny MiniCPM4 (LongRoPE, GQA 4/2) with SMALL_SPARSE."""
    from arkinfer.models.configs import tiny_config
    from arkinfer.testing.synthetic import write_checkpoint

    root = tmp_path_factory.mktemp("tvm-sparse")
    src = write_checkpoint(root / "hf", tiny_config("minicpm", vocab_size=300,
                                                    sparse_config=SMALL_SPARSE))
    out = root / "artifact"
    out.mkdir()
    BACKEND.lower(LowerRequest(model_dir=src, source_dir=src, recipe=None, dtype="f32",
                               target=None, out_dir=out,
                               # float32 matrices: the reference below is the float source
                               options={"devices": "none", "float_weights": "f32"}))
    return src, out


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_decode_past_dense_len_gives_the_reference_tokens(sparse_model):
    """Prompt of 140 tokens (dense), 40 greedy tokens: decoding crosses dense_len=150 and runs
    InfLLM v2 (6 of up to 12 blocks) in the module; the tokens are the reference model's."""
    src, out = sparse_model
    runner = BACKEND.load(out)
    assert runner.fixed_attention is None  # the module runs InfLLM v2 itself
    prompt = _ids(140, seed=1)
    assert greedy_tokens(runner, prompt, 40) == greedy_tokens(ReferenceRunner(src), prompt, 40)
    info = json.loads((out / "tvm_module.json").read_text())
    assert info["ops"]["attention"].startswith("InfLLM v2 (TVM TIR)")
    # decode's stage 2 is the block gather (kernels_sparse_decode) in the host library
    assert b"infllm_sparse_decode" in (out / info["host"]["library"]).read_bytes()
    assert info["cache"]["dense_len"] == 150


def test_sparse_prefill_matches_the_reference_and_differs_from_dense(sparse_model):
    """One prefill of 190 tokens (sparse: total >= dense_len), then a second chunk over the
    cache: the logits are the reference model's, and not dense attention's."""
    src, out = sparse_model
    runner, reference = BACKEND.load(out), ReferenceRunner(src)
    ids = _ids(200, seed=2)
    got = runner.window_logits(ids[:190])
    want = reference.window_logits(ids[:190])
    # fp32 summation order only: the module's dot products run as 32 interleaved partial sums
    # (cpu_schedule.LinearRows), the reference's in torch's order
    torch.testing.assert_close(got, want, atol=5e-4, rtol=1e-4)
    dense = ReferenceRunner(src, dense=True).window_logits(ids[:190])
    assert float((want[-40:] - dense[-40:]).abs().max()) > 1e-3  # InfLLM v2 really ran
    chunk = runner._step(ids[190:], last_only=False)  # a prefill over a non-empty cache
    torch.testing.assert_close(chunk, reference.window_logits(ids)[190:], atol=5e-4, rtol=1e-4)


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
def test_decode_gather_equals_masked_dense_and_reads_only_selected_blocks(sparse):
    """One decode query (T = 1): the host's block gather (InfLLMv2Module `decode`, the kernel the
    model's host decode calls) equals the masked dense softmax (`main`) within fp32 summation
    order. Sparse: V rows of blocks outside the selection set to NaN leave the gather's output
    unchanged (they are never read), while the masked dense path turns NaN (0 * NaN)."""
    from arkinfer.backends.tvm.infllmv2 import InfLLMv2Module
    from arkinfer.ops.infllmv2.config import SparseConfig

    cfg = SparseConfig.from_dict(SMALL_SPARSE)
    hq, hkv, dim, length = 4, 2, 16, 203
    module = InfLLMv2Module(hq, hkv, dim, cfg, scale=dim ** -0.5)
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s).astype(np.float32)
               for s in ((1, hq, 1, dim), (1, hkv, length, dim), (1, hkv, length, dim)))
    out, idx, *_ = module.run(q, k, v, sparse)
    want, want_idx, *_ = module.run(q, k, v, sparse, gather=False)
    np.testing.assert_array_equal(idx, want_idx)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    if not sparse:
        return
    blocks = -(-length // cfg.block_size)
    poisoned = v.copy()
    for h in range(hkv):
        chosen = set(int(c) for c in idx[0, h, 0] if c >= 0)
        assert 0 < len(chosen) < blocks
        for c in set(range(blocks)) - chosen:
            poisoned[0, h, c * cfg.block_size:(c + 1) * cfg.block_size] = np.nan
    again, *_ = module.run(q, k, poisoned, sparse)
    np.testing.assert_array_equal(again, out)
    assert np.isnan(module.run(q, k, poisoned, sparse, gather=False)[0]).all()
