"""InfLLM v2 inside llama.cpp (backends/gguf/llamacpp_patch, `arkinfer doctor --build-llamacpp`).

The shipped demo (MiniCPM4.1 architecture, sparse_config: kernel 32/16, block 64, window 256,
topk 4 -> 8 blocks = 512 keys per query, dense_len 1024) lowered to an F32 GGUF runs in the patched
llama.cpp; past dense_len its logits, its selected blocks and its greedy tokens must equal the
reference model's (arkinfer/models/minicpm.py with arkinfer/ops/infllmv2). Tests that need the
patched library skip, naming the command, when it is not built.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile

import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("llama_cpp", reason="llama-cpp-python (the [gguf] extra) is not installed")

from arkinfer.backends.gguf import llamacpp_build
from arkinfer.backends.gguf.backend import BACKEND
from arkinfer.backends.gguf.runner import LlamaCppRunner
from arkinfer.pipeline.reference_runner import ReferenceRunner

from arkinfer.backend import LowerRequest
from arkinfer.errors import ArkError
from arkinfer.frontend.demo import demo_model_path
from arkinfer.ops.infllmv2 import reference

pytestmark = pytest.mark.llamacpp
DENSE_LEN = 1024       # the demo's sparse_config
FULL_VIEW = 512        # positions below budget * block_size see every past block


def _lib():
    lib = llamacpp_build.patched_library_dir()
    if lib is None:
        pytest.skip("the InfLLM v2 llama.cpp is not built: run `arkinfer doctor --build-llamacpp`")
    return lib


@pytest.fixture(scope="module")
def demo_gguf(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo-f32")
    demo = demo_model_path()
    BACKEND.lower(LowerRequest(demo, demo, None, "f32", None, out, options={}))
    return out / "model.gguf"


@pytest.fixture(scope="module")
def patched(demo_gguf):
    from arkinfer.backends.gguf.subprocess_runner import SubprocessLlamaCppRunner

    runner = SubprocessLlamaCppRunner(demo_gguf, _lib(), n_ctx=2048, kv_type="f32",
                                      debug_blocks=True)
    yield runner
    runner.close()


def random_ids(n: int, seed: int = 1) -> list[int]:
    return torch.randint(5, 2000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_indexer_keys_written(demo_gguf):
    """The writer emits minicpm.attention.indexer.* (llama.cpp's MSA naming) next to arkinfer.sparse.*."""
    reader = gguf.GGUFReader(demo_gguf)
    f = {k: reader.fields[k].contents() for k in reader.fields if ".indexer." in k}
    assert f == {"minicpm.attention.indexer.block_size": 64, "minicpm.attention.indexer.top_k": 8,
                 "minicpm.attention.indexer.local_blocks": 5,
                 "minicpm.attention.indexer.init_blocks": 1,
                 "minicpm.attention.indexer.kernel_size": 32,
                 "minicpm.attention.indexer.kernel_stride": 16,
                 "minicpm.attention.indexer.dense_len": DENSE_LEN,
                 "minicpm.attention.indexer.use_nope": False}


def test_upstream_llamacpp_runs_the_same_file_dense(demo_gguf):
    """The wheel's own (unpatched) llama.cpp loads the file with the new keys and runs it dense."""
    ids = random_ids(1100)
    ours = LlamaCppRunner(demo_gguf, n_ctx=2048, kv_type="f32").window_logits(ids)
    ref = ReferenceRunner(demo_model_path(), dense=True).window_logits(ids)
    assert (ours - ref).abs().max().item() <= 1e-3


def test_failed_build_is_one_error_and_dense_runner_stays(tmp_path, monkeypatch, demo_gguf):
    """No cmake on PATH: one LlamaCppBuildError naming it; no library, so load() stays dense."""
    monkeypatch.setenv("ARKINFER_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(llamacpp_build.LlamaCppBuildError, match="'cmake' is not on PATH") as exc:
        llamacpp_build.build_patched_llamacpp()
    assert "--build-llamacpp" in exc.value.hint
    assert llamacpp_build.patched_library_dir() is None
    shutil.copy(demo_gguf, tmp_path / "model.gguf")
    runner = BACKEND.load(tmp_path, {"runner": {"n_ctx": 256}})
    assert type(runner) is LlamaCppRunner and runner.fixed_attention == "dense"


def test_patch_set_applies_cleanly_to_the_pinned_sdist(tmp_path):
    """Every patch applies (no fuzz, no offset rejects) to pristine files of the pinned sdist."""
    tar = llamacpp_build.build_root() / f"llama_cpp_python-{llamacpp_build.PINNED_VERSION}.tar.gz"
    if not tar.is_file():
        pytest.skip("the pinned sdist is not in the cache: run `arkinfer doctor --build-llamacpp`")
    files = llamacpp_build.touched_files(llamacpp_build.patch_files())
    llamacpp_build._restore(tar, tmp_path, files)
    for p in llamacpp_build.patch_files():
        done = subprocess.run(["patch", "-p1", "--forward", "--batch", "-F0", "-i", str(p)],
                              cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "offset" not in done.stdout and "fuzz" not in done.stdout, done.stdout


def test_prefill_logits_equal_reference_past_dense_len(patched):
    """window_logits over 1300 tokens (ubatches of 512: dense, then sparse at totals 1024 and
    1300) == the reference model with InfLLM v2 within 1e-3; the sparse reference differs from
    dense there, so the comparison can tell the two apart."""
    ids = random_ids(1300)
    ours = patched.window_logits(ids)
    ref = ReferenceRunner(demo_model_path()).window_logits(ids)
    dense = ReferenceRunner(demo_model_path(), dense=True).window_logits(ids)
    assert (ours - ref).abs().max().item() <= 1e-3
    assert (dense - ref)[1024:].abs().max().item() > 1e-2


def test_selected_blocks_equal_reference(patched, monkeypatch):
    """The blocks llama.cpp selected (graph tensors infllm_idx-<layer>) == the reference's idx, for
    every layer, KV head and query past full visibility."""
    ids = random_ids(1300, seed=2)
    patched.window_logits(ids)
    ours = patched.selected_blocks()                 # {layer: [ubatch idx [HKV, T, K]]}
    captured = []
    original = reference.infllmv2_attention

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        captured.append(result[2])
        return result

    monkeypatch.setattr(reference, "infllmv2_attention", spy)
    runner = ReferenceRunner(demo_model_path())
    runner.model.set_sparse_impl("reference")
    runner.window_logits(ids)
    layers = sorted(ours)
    assert layers == list(range(len(captured))) and len(layers) == 4
    for layer in layers:
        got = torch.cat(ours[layer], dim=1)           # ubatches at 512.. and 1024.. : [HKV, 788, K]
        assert got.shape[1] == 1300 - FULL_VIEW
        want = captured[layer][0, :, FULL_VIEW:]       # [HKV, 788, budget], -1 padded
        pos = torch.arange(FULL_VIEW, 1300)
        qb = (pos // 64)[None, :, None]
        got = torch.where(got > qb, -1, got)
        got = torch.where(got < 0, 1 << 30, got).sort(-1).values
        got = torch.where(got == 1 << 30, -1, got)
        assert torch.equal(got, want), f"layer {layer}: {(got != want).any(-1).sum()} rows differ"


def test_decode_steps_equal_reference_across_dense_len(patched):
    """Prefill 1000 tokens (dense), then decode one token at a time to 1100: every step's logits
    == the reference's within 1e-3, through the crossing of dense_len (1024)."""
    ids = random_ids(1100, seed=3)
    ref = ReferenceRunner(demo_model_path())
    patched.reset()
    ours = [patched.prefill(ids[:1000])]
    want = [ref.prefill(ids[:1000])]
    for t in ids[1000:]:
        ours.append(patched.decode(t))
        want.append(ref.decode(t))
    err = (torch.stack(ours) - torch.stack(want)).abs().amax(-1)
    assert err.max().item() <= 1e-3, f"worst step {int(err.argmax())}: {err.max().item():.3g}"


def test_greedy_tokens_equal_reference_past_dense_len(patched):
    """The sparse GGUF generates the reference model's greedy tokens from 1010 to 1090."""
    prompt = random_ids(1010, seed=4)
    ref = ReferenceRunner(demo_model_path())
    patched.reset()
    a, b = patched.prefill(prompt), ref.prefill(prompt)
    ours, want = [], []
    for _ in range(80):
        ours.append(int(a.argmax()))
        want.append(int(b.argmax()))
        a, b = patched.decode(ours[-1]), ref.decode(want[-1])
    assert ours == want


def _parallel_schedule():
    """Three sequences (A 1230, B 1130, C 724 tokens) fed as llama-server's slots would be: each
    step is one llama_decode, {seq: (start, end)}; every step gives each of its sequences the same
    count, so it is one ubatch. Streams per ubatch: 3 dense; A alone crossing dense_len (sparse);
    B alone (1000 < dense_len: dense, 16 blocks > budget); C alone; A and B sparse with C dense in
    one batch; 24 decode steps of all three (A, B sparse; C dense at 700..724, past full view);
    6 decode steps of A and B."""
    steps = [{0: (0, 448), 1: (0, 448), 2: (0, 448)}, {0: (448, 1100)}, {1: (448, 1000)},
             {2: (448, 600)}, {0: (1100, 1200), 1: (1000, 1100), 2: (600, 700)}]
    steps += [{0: (1200 + k, 1201 + k), 1: (1100 + k, 1101 + k), 2: (700 + k, 701 + k)}
              for k in range(24)]
    steps += [{0: (1224 + k, 1225 + k), 1: (1124 + k, 1125 + k)} for k in range(6)]
    return steps


def test_parallel_sequences_equal_reference(patched):
    """Three sequences side by side in one context (a KV stream each, as llama-server's parallel
    slots): batches and decode steps mixing sparse and dense streams. Every sequence's logits ==
    the reference model run alone over the same chunks, within 1e-3; past dense_len the reference
    differs from dense, so each stream's sparse attention is checked."""
    seqs = {0: random_ids(1230, seed=11), 1: random_ids(1130, seed=12), 2: random_ids(730, seed=13)}
    steps = _parallel_schedule()
    patched.parallel_start(3, 2048, kv_type="f32", n_batch=1536)
    ours: dict[int, list[torch.Tensor]] = {0: [], 1: [], 2: []}
    for step in steps:
        out = patched.parallel_step({s: seqs[s][a:b] for s, (a, b) in step.items()})
        assert sorted(out) == sorted(step)
        for s, logits in out.items():
            ours[s].append(logits)
    for s, ids in seqs.items():
        ref = ReferenceRunner(demo_model_path())
        want = torch.cat([ref.chunk_logits(ids[a:b]) for step in steps
                          for seq, (a, b) in step.items() if seq == s])
        got = torch.cat(ours[s])
        err = (got - want).abs().amax(-1)
        assert err.max().item() <= 1e-3, f"sequence {s}: position {int(err.argmax())}, {err.max():.3g}"
        if s < 2:   # A and B run sparse past dense_len: tell it from dense
            dense = ReferenceRunner(demo_model_path(), dense=True).window_logits(ids[:len(got)])
            assert (dense - want)[DENSE_LEN:].abs().max().item() > 1e-2


def test_parallel_sequences_in_a_unified_cache_run_dense(patched):
    """kv_unified=True interleaves the sequences' cells, so blocks cannot be anchored: the patched
    graph runs dense through llama.cpp's own attention (as upstream MSA does): the dense reference
    within the f16 rounding that llama.cpp's flash attention applies to an f32 cache, and far from
    the sparse reference past dense_len."""
    ids = [random_ids(1100, seed=14), random_ids(1100, seed=15)]
    patched.parallel_start(2, 1100, kv_type="f32", n_batch=1024, kv_unified=True)
    got = {0: [], 1: []}
    for a, b in ((0, 500), (500, 1000), (1000, 1100)):
        for s, logits in patched.parallel_step({0: ids[0][a:b], 1: ids[1][a:b]}).items():
            got[s].append(logits)
    for s in (0, 1):
        dense = ReferenceRunner(demo_model_path(), dense=True).window_logits(ids[s])
        sparse = ReferenceRunner(demo_model_path()).window_logits(ids[s])
        assert (torch.cat(got[s]) - dense).abs().max().item() <= 2e-2
        assert (torch.cat(got[s]) - sparse)[DENSE_LEN:].abs().max().item() > 1


def test_parallel_sequences_refuse_bad_steps(patched):
    """Unknown sequence ids, an oversized step and a full stream are one clear error each, and
    the sequences stay usable."""
    patched.parallel_start(2, 256, kv_type="f32", n_batch=64)
    with pytest.raises(ArkError, match=r"sequence ids \[2\] are outside 0 .. 1"):
        patched.parallel_step({2: [5]})
    with pytest.raises(ArkError, match="a step takes 1 .. 64 tokens in all, got 80"):
        patched.parallel_step({0: [5] * 40, 1: [6] * 40})
    for _ in range(4):
        patched.parallel_step({0: [5] * 64})
    with pytest.raises(ArkError, match=r"sequences \[0\] would exceed their 256 cache cells"):
        patched.parallel_step({0: [5]})
    assert patched.parallel_step({1: [7, 8]})[1].shape == (2, 2048)


def test_load_picks_the_patched_runner_and_manifest_says_so(tmp_path):
    """With the build present, lower() says InfLLM v2 and load() returns the child-process runner;
    ARKINFER_LLAMACPP=upstream falls back to the dense in-process runner."""
    _lib()
    from arkinfer.backends.gguf.subprocess_runner import SubprocessLlamaCppRunner

    demo = demo_model_path()
    result = BACKEND.lower(LowerRequest(demo, demo, None, "f32", None, tmp_path, options={}))
    assert result.ops["attention"].startswith("InfLLM v2 (patched llama.cpp")
    runner = BACKEND.load(tmp_path, {"runner": {"n_ctx": 256}})
    try:
        assert isinstance(runner, SubprocessLlamaCppRunner) and runner.fixed_attention is None
        assert runner.vocab_size == 2048 and runner.tokenize("hello") == \
            LlamaCppRunner(tmp_path / "model.gguf", n_ctx=256, vocab_only=True).tokenize("hello")
    finally:
        runner.close()


@pytest.mark.heavy
def test_build_from_scratch_then_reuse(tmp_path, monkeypatch):
    """`arkinfer doctor --build-llamacpp` in an empty cache: download, patch, build (~15 min on 2
    cores), then a second call reuses the build."""
    monkeypatch.setenv("ARKINFER_CACHE", str(tmp_path))
    lib = llamacpp_build.build_patched_llamacpp(jobs=2)
    assert (lib / "libllama.so").is_file()
    stamp = json.loads((lib / llamacpp_build.STAMP).read_text())
    assert stamp["patches"] == llamacpp_build.patch_set_hash()
    assert llamacpp_build.build_patched_llamacpp() == lib
    with tarfile.open(next(lib.parent.glob("*.tar.gz"))) as tf:
        assert any(m.name.endswith("src/models/minicpm.cpp") for m in tf.getmembers())


def test_deep_sparse_model_fits_the_graph_budget(tmp_path):
    """A 16-layer copy of the demo (its 4 layers repeated) runs sparse past dense_len and equals
    the reference: llama.cpp's default graph budget (8 nodes per tensor) is too small for InfLLM
    v2's per-layer nodes from ~8 layers on (patch 0004 gives MiniCPM with InfLLM v2 MSA's)."""
    from safetensors.torch import load_file, save_file

    demo = demo_model_path()
    deep = tmp_path / "deep"
    deep.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy2(demo / f, deep / f)
    config = json.loads((demo / "config.json").read_text())
    base = config["num_hidden_layers"]
    config["num_hidden_layers"] = 16
    (deep / "config.json").write_text(json.dumps(config))
    tensors = {}
    for shard in sorted(demo.glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
    out = {k: v for k, v in tensors.items() if ".layers." not in k}
    for i in range(16):
        prefix = f"model.layers.{i % base}."
        out.update({k.replace(prefix, f"model.layers.{i}."): v.clone()
                    for k, v in tensors.items() if k.startswith(prefix)})
    save_file(out, str(deep / "model.safetensors"))
    art = tmp_path / "gguf"
    BACKEND.lower(LowerRequest(deep, deep, None, "f32", None, art, options={}))
    from arkinfer.backends.gguf.subprocess_runner import SubprocessLlamaCppRunner

    runner = SubprocessLlamaCppRunner(art / "model.gguf", _lib(), n_ctx=2048, kv_type="f32")
    try:
        ids = random_ids(DENSE_LEN + 100, seed=3)
        ours = runner.window_logits(ids)
    finally:
        runner.close()
    ref = ReferenceRunner(deep).window_logits(ids)
    assert (ours - ref)[DENSE_LEN:].abs().max().item() <= 1e-3
