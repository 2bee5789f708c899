"""InfLLM v2 state through the MiniCPM model: the compressed keys travel with the KV cache.

Decode with the carried (incrementally extended) state must equal decode that recompresses the
whole cache every step (the caller hands back plain (k, v) tuples, which carry no state).
"""

from __future__ import annotations

import pytest
import torch

from arkinfer.frontend.checkpoint import load
from arkinfer.generate import generate
from arkinfer.models.minicpm import SparseLayerCache
from arkinfer.ops.infllmv2 import compress_keys

# Budget (topk + window/block) * block = (3 + 2) * 8 = 40 keys, sparse from 48 tokens on.
SPARSE = {"kernel_size": 8, "kernel_stride": 4, "block_size": 8, "init_blocks": 1,
          "window_size": 16, "topk": 3, "use_nope": False, "dense_len": 48}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from arkinfer.testing.synthetic import write_checkpoint
    from arkinfer.models.configs import tiny_config

    folder = write_checkpoint(tmp_path_factory.mktemp("minicpm-sparse"),
                              tiny_config("minicpm", sparse_config=SPARSE))
    _, m = load(folder)
    return m


pytestmark = pytest.mark.usefixtures("one_thread")


class Recompressing:
    """The model, but every cache it returns is stripped to plain (k, v) tuples: each call
    recompresses the whole cache, the behaviour the carried state must reproduce."""

    def __init__(self, model) -> None:
        self.model = model

    def __call__(self, ids, positions, cache):
        logits, cache = self.model(ids, positions, cache)
        assert all(isinstance(c, SparseLayerCache) == (c[0].shape[2] >= 48) for c in cache)
        return logits, [tuple(c) for c in cache]

    def empty_cache(self, batch):
        return self.model.empty_cache(batch)


def _decode(model, ids, prompt):
    """Prefill `prompt` tokens, then feed the rest one at a time: logits of every step, cache."""
    with torch.no_grad():
        logits, cache = model(ids[:, :prompt], torch.arange(prompt), model.empty_cache(ids.shape[0]))
        steps = [logits[:, -1]]
        for p in range(prompt, ids.shape[1]):
            logits, cache = model(ids[:, p:p + 1], torch.tensor([p]), cache)
            steps.append(logits[:, -1])
    return torch.stack(steps, 1), cache


@pytest.mark.parametrize("prompt", [30, 60], ids=["crosses-dense_len", "sparse-prompt"])
def test_carried_state_equals_recompression(model, prompt):
    ids = torch.randint(3, 500, (2, 110), generator=torch.Generator().manual_seed(prompt))
    carried, cache = _decode(model, ids, prompt)
    recompressed, plain = _decode(Recompressing(model), ids, prompt)
    torch.testing.assert_close(carried, recompressed, rtol=1e-5, atol=1e-5)
    # The final state is exactly the compression of the final cache.
    for layer, plain_layer in zip(cache, plain):
        assert isinstance(layer, SparseLayerCache) and tuple(map(torch.equal, layer, plain_layer))
        full = compress_keys(layer[0], model.model.layers[0].self_attn.sparse)
        assert layer.infllm.length == full.length == 110
        assert torch.equal(layer.infllm.fine, full.fine)
        assert torch.equal(layer.infllm.coarse, full.coarse)


def test_greedy_generation_same_tokens(model):
    prompt = torch.randint(3, 500, (70,), generator=torch.Generator().manual_seed(1)).tolist()
    carried = list(generate(model, prompt, 40))
    recompressed = list(generate(Recompressing(model), prompt, 40))
    assert carried == recompressed


def test_decode_extends_the_state_instead_of_recompressing(model):
    """Steps that complete no kernel hand the very same tensors on; the others append to them."""
    ids = torch.randint(3, 500, (1, 80), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, cache = model(ids[:, :60], torch.arange(60), model.empty_cache(1))
        for p in range(60, 80):
            before = cache[0].infllm
            _, cache = model(ids[:, p:p + 1], torch.tensor([p]), cache)
            after = cache[0].infllm
            assert after.length == p + 1
            stride = SPARSE["kernel_stride"]
            if (p + 1 - SPARSE["kernel_size"]) % stride:   # no fine kernel completes at p
                assert after.fine is before.fine
            else:
                assert torch.equal(after.fine[:, :, :before.fine.shape[2]], before.fine)


def test_a_cut_back_cache_drops_the_state(model):
    """A caller that truncates the KV cache (and keeps the wrapper) must not reuse a state that
    describes keys no longer there."""
    ids = torch.randint(3, 500, (1, 90), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, cache = model(ids[:, :80], torch.arange(80), model.empty_cache(1))
        cut = [SparseLayerCache(c[0][:, :, :60], c[1][:, :, :60], c.infllm) for c in cache]
        a, _ = model(ids[:, 60:61], torch.tensor([60]), cut)
        b, _ = model(ids[:, 60:61], torch.tensor([60]), [tuple(c) for c in cut])
    assert torch.equal(a, b)
