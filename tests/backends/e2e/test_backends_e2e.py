"""One flow over every registered backend, plus the `numpy` test backend that registers itself
from outside (conftest.py): build -> verify -> load -> eval -> bench, on the embedded demo
(MiniCPM with InfLLM v2) and on a tiny Llama.

Each (backend, model) is built once (`--quant int4`: the first 4-bit preset the backend takes),
for the first target whose profile lists the backend (host when it does). A backend whose
toolchain is not installed here is skipped with its install hint. Every step asserts what the
artifact really does: the build's and `verify`'s gates passed, the runner's logits agree with
ArkInfer's reference model (on the artifact's own weights at the backend's `fidelity_top1` where
it declares `reference_weights`, else on the float source at the scheme's gate), eval's
perplexity is finite, bench measures positive tokens/s."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from numpy_backend.backend import NAME as TEST_BACKEND
from numpy_backend.backend import PROFILE

from arkinfer.backend import backend_names, get_backend
from arkinfer.generate import windows_of, windows_perplexity
from arkinfer.pipeline.artifact import load_runner, verify_artifact
from arkinfer.pipeline.bench import BenchSpec, run_bench
from arkinfer.pipeline.build import build
from arkinfer.pipeline.manifest import recipe_of
from arkinfer.pipeline.plan import CalibSettings, resolve_plan
from arkinfer.pipeline.reference_runner import ReferenceRunner
from arkinfer.pipeline.verify import (
    EVAL_TEXT,
    parity_metrics,
    thresholds_for,
    verification_prompts,
)
from arkinfer.targets import list_targets, load_target

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = ("demo", "tiny-llama")
CALIB = CalibSettings(None, samples=8, seq_len=128)
BENCH = BenchSpec(prompts=(16,), gens=(4,), repetitions=1, warmup=0)
CASES = [(b, m) for b in (*backend_names(), TEST_BACKEND) for m in MODELS]


def target_for(backend: str) -> str:
    """The profile the backend is built for: the test backend's own; host when host lists the
    backend; else the first shipped profile that lists it."""
    if backend == TEST_BACKEND:
        return str(PROFILE)
    if backend in load_target("host").backends:
        return "host"
    return next(t.id for t in list_targets() if backend in t.backends)


@pytest.fixture(scope="module", params=CASES, ids=[f"{b}-{m}" for b, m in CASES])
def artifact(request, tmp_path_factory):
    """(backend, model folder, artifact folder, manifest): one build per case for the module."""
    name, model = request.param
    if name == TEST_BACKEND:
        request.getfixturevalue("numpy_backend_installed")
    backend = get_backend(name)
    if not backend.available():
        pytest.skip(f"{name}: toolchain not installed ({backend.install_hint()})")
    source = str(request.getfixturevalue("tiny_llama")) if model == "tiny-llama" else "demo"
    out = tmp_path_factory.mktemp("e2e") / f"{name}-{model}"
    plan = resolve_plan(source, target=target_for(name), quant="int4", backend=name, out=out,
                        calib=CALIB)
    result = build(plan)
    return backend, plan.source, result.path, result.manifest


def test_build_and_verify_pass(artifact):
    backend, _, path, manifest = artifact
    assert manifest["backend"]["name"] == backend.name
    assert manifest["verification"]["passed"], manifest["verification"]["failures"]
    report = verify_artifact(path)
    assert report["passed"], report["failures"]
    assert report["recorded_mismatches"] == []
    if backend.reference_weights(path) is not None:
        assert report["fidelity"]["passed"], report["fidelity"]
        assert report["fidelity"]["threshold_top1"] == backend.fidelity_top1


def test_runner_agrees_with_the_reference_model(artifact):
    backend, source, path, manifest = artifact
    _, runner = load_runner(path)
    weights = backend.reference_weights(path)
    dense = runner.fixed_attention == "dense"
    reference = ReferenceRunner(weights or source, dense=dense)
    # the short prompts verify uses (no long InfLLM v2 prompt: that one the build's gate ran)
    prompts = verification_prompts(reference.tokenizer, {}, n=4)
    metrics = parity_metrics(reference, runner, prompts)
    need = (backend.fidelity_top1 if weights is not None else
            thresholds_for(recipe_of(manifest), manifest["quant"]["dtype"]).top1)
    assert metrics["top1_agreement"] >= need, metrics
    assert runner.window_logits(prompts[0]).shape == (len(prompts[0]), runner.vocab_size)


def test_eval_gives_a_finite_perplexity(artifact):
    _, _, path, _ = artifact
    _, runner = load_runner(path)
    ids = runner.tokenize(EVAL_TEXT.read_text(encoding="utf-8"))
    result = windows_perplexity(runner.window_logits, windows_of(ids, 64)[:2], 64)
    assert math.isfinite(result.ppl) and result.ppl > 1.0  # a random model may beat no bound
    assert result.windows == 2 and result.tokens == 2 * 63


def test_bench_measures_positive_rates(artifact):
    _, _, path, _ = artifact
    manifest, runner = load_runner(path, bench=True)
    rows = run_bench(runner, manifest, BENCH)
    assert [r["test"] for r in rows] == ["pp16", "tg4"]
    assert all(r["avg_ts"] > 0 and math.isfinite(r["avg_ts"]) for r in rows), rows


def test_the_test_backend_is_registered_by_its_entry_point_alone(numpy_backend_installed):
    from arkinfer.backend import Backend

    assert TEST_BACKEND in backend_names()
    backend = get_backend(TEST_BACKEND)
    assert isinstance(backend, Backend) and backend.capabilities.formats == ("gptq",)
    assert Path(backend.__module__.replace(".", "/")).parts[0] == "numpy_backend"
