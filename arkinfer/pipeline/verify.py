"""The parity gate: an artifact's Runner against the float reference model on fixed prompts.

    prompts = verification_prompts(tokenizer, raw_config)           # list of token-id lists
    metrics = parity_metrics(reference_runner, artifact_runner, prompts)
    result = judge(metrics, thresholds_for(recipe, dtype, overrides))

Metrics (all prompts together, every position scored):
- `top1_agreement`: fraction of positions where both argmax the same next token;
- `mean_kl`: mean KL(p_reference || p_artifact) in nats per position;
- `ppl_reference`, `ppl_artifact`: perplexity of each on the prompts' own next tokens, and
  `ppl_delta` = ppl_artifact / ppl_reference - 1 (0.05 = 5 % worse);
- `max_abs_logit_diff`: the largest logit difference anywhere (reported, not gated).

Thresholds come from the scheme class (`THRESHOLDS`) or the command line (`--threshold`), never
from the artifact under test; `recorded_mismatches` lists where the metrics a manifest records
differ from the re-measured ones. Non-finite logits from either runner are an error
(`arkinfer.generate.NonFiniteError`), never a metric.

Both runners get the same token ids (the reference tokenizer's); whether the artifact's own
tokenizer agrees is a separate metric, `tokenizer_agreement` (fraction of prompts with identical
ids). The prompts are paragraphs of arkinfer/data/corpus_eval.txt (held out from calibration),
cut to `prompt_tokens`; sparse-config models get one extra prompt longer than `dense_len`, so
InfLLM v2 is exercised when dense_len allows.

On a runner that speculates, `speculative_check` also decodes SPEC_TOKENS greedy tokens after
each prompt plainly and with a prompt-lookup draft: the tokens must be identical (a difference
fails the gate, unless it is a near tie that batched and single-token kernels order differently:
pipeline/verify_speculative.py); the result's `speculative` entry says what was checked, or why nothing was.

The same prompts and metrics measure quantisation alone, with no runtime in between:
`quantisation_quality(source, quantised_folder)` (what `arkinfer quantize` prints beside the
SNR) and `backend_fidelity(..., reference=...)`'s `quantisation` entry (the build's summary).
The float model's logits are recorded once (`float_reference`) and the model released.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from arkinfer.errors import ArkError
from arkinfer.frontend.checkpoint import read_config
from arkinfer.generate import exp_nll, require_finite

EVAL_TEXT = Path(__file__).resolve().parents[1] / "data" / "corpus_eval.txt"
N_PROMPTS = 6
PROMPT_TOKENS = 96
LONG_PROMPT_MAX = 2048


class VerifyError(ArkError):
    """The artifact failed the parity gate (or could not be checked)."""


@dataclass(frozen=True)
class Thresholds:
    """Pass when top1_agreement >= top1, mean_kl <= kl and ppl_delta <= ppl_delta."""

    top1: float
    kl: float
    ppl_delta: float

    def as_dict(self) -> dict[str, float]:
        return {"top1": self.top1, "kl": self.kl, "ppl_delta": self.ppl_delta}


# Per scheme class. Float and 8-bit must be near-lossless. The 4-bit class is derived by
# benchmarks/gate_thresholds.py (results/gate_thresholds.json) on SmolLM2-135M, the smallest and
# most quantisation-sensitive model ArkInfer builds: a build no better than llama.cpp's own Q4_0
# passes, a broken layout fails. llama.cpp Q4_0 (run by llama.cpp) scores top-1 0.664, KL 0.319,
# ppl +16.7 % on these verify prompts (539 positions) and 0.679 / 0.340 / +27.7 % on average over
# the held-out texts (benchmarks/results/quant_quality_heldout.json); the worse of the two, with
# its own spread over the held-out domains as the margin (worst domain vs mean: top-1 0.595,
# -0.084; KL 0.501, x1.47; ppl +42.3 %, x1.53), rounded outwards: top-1 0.664 - 0.084 -> 0.58,
# KL 0.340 x 1.47 -> 0.51, ppl 0.277 x 1.53 -> 0.43. On the verify prompts ArkInfer's GPTQ Q4_0
# scores 0.772 / 0.149 / +17.9 % and RTN Q4_0 0.662 / 0.319 / +16.9 % (pass); llama.cpp's Q4_0
# file with each byte's nibbles swapped (a wrong block layout) 0.000 / 20.4 / x3e8 (fails).
# Ternary post-training quantisation of a model not trained for it (BitNet-style training is
# what makes ternary work) changes many top-1 choices, so its class gates mainly on perplexity: at most twice the float
# model's. The demo model passes it; SmolLM2 (perplexity x100) fails it (see README).
THRESHOLDS: dict[str, Thresholds] = {
    "f32": Thresholds(top1=0.99, kl=0.001, ppl_delta=0.01),
    "f16": Thresholds(top1=0.97, kl=0.01, ppl_delta=0.02),
    "bf16": Thresholds(top1=0.95, kl=0.02, ppl_delta=0.03),
    "8bit": Thresholds(top1=0.90, kl=0.05, ppl_delta=0.05),
    "4bit": Thresholds(top1=0.58, kl=0.51, ppl_delta=0.43),
    "ternary": Thresholds(top1=0.25, kl=2.0, ppl_delta=1.0),
}


# What a threshold may be: (lowest, highest) allowed, both inclusive; every value must be finite.
THRESHOLD_RANGES: dict[str, tuple[float, float]] = {
    "top1": (0.0, 1.0), "kl": (0.0, math.inf), "ppl_delta": (0.0, math.inf)}


def scheme_class(recipe, dtype: str) -> str:
    if recipe is None:
        return dtype
    if recipe.calib == "ternary" or recipe.bits <= 2:
        return "ternary"
    return "8bit" if recipe.bits >= 8 else "4bit"


def check_threshold(key: str, value: float) -> float:
    """`value` as a float if `key` is a known threshold and the value is finite and in range."""
    if key not in THRESHOLD_RANGES:
        raise ArkError(f"unknown threshold {key!r}; known: {', '.join(THRESHOLD_RANGES)}",
                       hint="write --threshold top1=0.8, kl=0.5 or ppl_delta=0.5")
    low, high = THRESHOLD_RANGES[key]
    value = float(value)
    if not (math.isfinite(value) and low <= value <= high):
        allowed = f"in [{low:g}, {high:g}]" if math.isfinite(high) else f">= {low:g}"
        raise ArkError(f"threshold {key}={value} is not allowed: {key} must be a finite number "
                       f"{allowed}", hint=f"e.g. --threshold {key}="
                       f"{THRESHOLDS['4bit'].as_dict()[key]}")
    return value


def thresholds_for(recipe, dtype: str, overrides: dict[str, float] | None = None) -> Thresholds:
    """The scheme class's thresholds with `overrides` (checked by `check_threshold`) applied."""
    kind = scheme_class(recipe, dtype)
    if kind not in THRESHOLDS:
        raise VerifyError(f"no parity thresholds for the scheme class {kind!r}; known: "
                          f"{', '.join(THRESHOLDS)}",
                          hint="the artifact's manifest names an unknown dtype; rebuild it")
    base = THRESHOLDS[kind].as_dict()
    for key, value in (overrides or {}).items():
        base[key] = check_threshold(key, value)
    return Thresholds(**base)


def parse_threshold_overrides(items: list[str] | None) -> dict[str, float]:
    """["top1=0.8", "kl=0.5"] -> {"top1": 0.8, "kl": 0.5} with errors naming the bad item."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            number = float(value)
        except ValueError:
            raise ArkError(f"--threshold {item!r} is not KEY=NUMBER",
                           hint="e.g. --threshold ppl_delta=2.0 --threshold top1=0.3") from None
        out[key.strip()] = check_threshold(key.strip(), number)
    return out


def eval_paragraphs() -> list[str]:
    """The non-empty paragraphs of corpus_eval.txt, in order."""
    return [p.strip() for p in EVAL_TEXT.read_text(encoding="utf-8").split("\n\n") if p.strip()]


def verification_prompts(tokenizer, raw_config: dict[str, Any], n: int = N_PROMPTS,
                         prompt_tokens: int = PROMPT_TOKENS) -> list[list[int]]:
    """Fixed prompts: the first `n` paragraphs of corpus_eval.txt cut to `prompt_tokens`, plus one
    long prompt past `dense_len` for sparse-config models (when dense_len < LONG_PROMPT_MAX)."""
    paragraphs = eval_paragraphs()
    prompts = [tokenizer.encode(p, add_special_tokens=False)[:prompt_tokens]
               for p in paragraphs[:n]]
    sparse = raw_config.get("sparse_config")
    if sparse:
        dense_len = int(sparse.get("dense_len", 8192))
        want = max(dense_len, 0) + 128
        if want <= LONG_PROMPT_MAX:
            stream = tokenizer.encode("\n\n".join(paragraphs), add_special_tokens=False)
            while len(stream) < want:
                stream = stream + stream
            prompts.append(stream[:want])
    return [p for p in prompts if len(p) >= 2]


@torch.no_grad()
def parity_metrics(reference, artifact, prompts: list[list[int]], progress=None) -> dict[str, Any]:
    """Compare two Runners (see module docstring) on `prompts`."""
    agree = positions = 0
    kl_sum = nll_ref = nll_art = 0.0
    max_diff = 0.0
    for i, ids in enumerate(prompts):
        if progress is not None:
            progress(f"prompt {i + 1}/{len(prompts)} ({len(ids)} tokens)")
        ref = reference.window_logits(ids).double()
        require_finite(ref, f"the float reference model (prompt {i + 1})")
        art = artifact.window_logits(ids).double()
        require_finite(art, f"the artifact's runner (prompt {i + 1} of {len(prompts)})")
        if ref.shape != art.shape:
            raise VerifyError(f"the artifact returned logits of shape {tuple(art.shape)} for "
                              f"{len(ids)} tokens; the reference {tuple(ref.shape)}",
                              hint="the artifact's vocabulary differs from its source model")
        agree += int((ref.argmax(-1) == art.argmax(-1)).sum())
        positions += ref.shape[0]
        lp_ref, lp_art = torch.log_softmax(ref, -1), torch.log_softmax(art, -1)
        kl_sum += float((lp_ref.exp() * (lp_ref - lp_art)).sum())
        target = torch.tensor(ids[1:])[:, None]
        nll_ref -= float(lp_ref[:-1].gather(1, target).sum())
        nll_art -= float(lp_art[:-1].gather(1, target).sum())
        max_diff = max(max_diff, float((ref - art).abs().max()))
    scored = sum(len(p) - 1 for p in prompts)
    ppl_ref, ppl_art = exp_nll(nll_ref / scored), exp_nll(nll_art / scored)
    return {"prompts": len(prompts), "positions": positions,
            "top1_agreement": agree / positions, "mean_kl": kl_sum / positions,
            "ppl_reference": ppl_ref, "ppl_artifact": ppl_art, "ppl_delta": ppl_art / ppl_ref - 1,
            "max_abs_logit_diff": max_diff}


class RecordedLogits:
    """A runner's logits per prompt, kept: `window_logits(ids)` returns the recorded [T, V]
    tensor (computing it on first use while the runner is attached). `release()` drops the runner
    and keeps the logits, so the float model leaves memory before the next model is loaded (an 8B
    model is 32 GB in float32; its logits on the verify prompts are ~0.2 GB), and one model's
    logits serve several comparisons without running it twice."""

    def __init__(self, runner, prompts: list[list[int]] = (), progress=None) -> None:
        self.runner = runner
        self.tokenizer = getattr(runner, "tokenizer", None)
        self.attention = "model"  # or "dense": see float_reference
        self.prompts = [list(p) for p in prompts]
        self.logits: dict[tuple[int, ...], torch.Tensor] = {}
        for i, ids in enumerate(self.prompts):
            if progress is not None:
                progress(f"float reference, prompt {i + 1}/{len(self.prompts)}")
            self.window_logits(ids)

    def window_logits(self, ids: list[int]) -> torch.Tensor:
        key = tuple(ids)
        if key not in self.logits:
            if self.runner is None:
                raise VerifyError(f"no recorded logits for a prompt of {len(ids)} tokens",
                                  hint="record every prompt before release(); this is a bug")
            self.logits[key] = self.runner.window_logits(list(ids))
        return self.logits[key]

    def release(self) -> RecordedLogits:
        self.runner = None
        return self


def float_reference(source: Path, runner=None, step: Callable[[str], None] | None = None
                    ) -> RecordedLogits:
    """The float model of `source` on the verify prompts, recorded and released (see
    RecordedLogits); `attention` is "dense" when `runner` always runs dense attention (llama.cpp
    on MiniCPM4): like with like, the float model then runs dense too; else "model". A model
    whose float32 weights do not fit in memory runs block by block (streamed_reference.py: the
    same logits, one block in memory)."""
    from arkinfer.pipeline.reference_runner import ReferenceRunner
    from arkinfer.pipeline.streamed_reference import StreamedReference, fits_in_memory

    step = step or (lambda message: None)
    attention = (runner.fixed_attention if runner is not None else None) or "model"
    if fits_in_memory(Path(source)):
        step("load the float reference")
        model = ReferenceRunner(source)
        if attention == "dense":
            model.set_attention("dense")
        prompts = verification_prompts(model.tokenizer, read_config(source))
        recorded = RecordedLogits(model, prompts, step).release()
    else:
        from arkinfer.frontend.checkpoint import open_checkpoint

        step("float reference: too large for memory in float32, streamed block by block")
        tokenizer = open_checkpoint(source).tokenizer
        prompts = verification_prompts(tokenizer, read_config(source))
        streamed = StreamedReference(Path(source), prompts, tokenizer, attention == "dense", step)
        recorded = RecordedLogits(streamed, prompts).release()
    recorded.attention = attention
    return recorded


# What `quantisation_quality` returns: the parity metrics that say how predictions change.
QUALITY_KEYS = ("prompts", "positions", "mean_kl", "top1_agreement", "ppl_reference",
                "ppl_artifact", "ppl_delta", "max_abs_logit_diff")


def quantisation_quality(source: Path, folder: Path,
                         step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """How quantising changed the model's predictions: `parity_metrics` of the quantised HF
    `folder` (ArkInfer's reference model over its dequantised weights, `quant.load`) against the
    float `source` on the verify prompts — the gate's own prompts and metrics, without a runtime.
    One model in memory at a time. Adds `seconds` (the whole measurement, loads included)."""
    import time

    from arkinfer.pipeline.reference_runner import ReferenceRunner

    t0 = time.perf_counter()
    reference = float_reference(Path(source), step=step)
    (step or (lambda message: None))("load the dequantised quantised model")
    quantised = ReferenceRunner(folder)
    metrics = parity_metrics(reference, quantised, reference.prompts, step)
    out = {key: metrics[key] for key in QUALITY_KEYS}
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def describe_quality(quality: dict[str, Any] | None) -> str:
    """"0.123 (top-1 agreement 81.2 %, perplexity +9.8 %)" for `QUALITY_KEYS` metrics."""
    if not quality:
        return "not measured (--no-kl)"
    return (f"{quality['mean_kl']:.3f} (top-1 agreement {quality['top1_agreement']:.1%}, "
            f"perplexity {quality['ppl_delta']:+.1%})").replace("%", " %")


def tokenizer_agreement(reference_tokenizer, artifact, n: int = N_PROMPTS) -> float:
    """Fraction of the prompt paragraphs the artifact's runtime tokenises to the same ids."""
    paragraphs = eval_paragraphs()[:n]
    same = sum(artifact.tokenize(p) == reference_tokenizer.encode(p, add_special_tokens=False)
               for p in paragraphs)
    return same / len(paragraphs)


def judge(metrics: dict[str, Any], thresholds: Thresholds) -> list[str]:
    """Failure lines naming the metric, its value and the threshold ([] = passed)."""
    fails = []
    if metrics["top1_agreement"] < thresholds.top1:
        fails.append(f"top1_agreement {metrics['top1_agreement']:.4f} < threshold "
                     f"{thresholds.top1}")
    if metrics["mean_kl"] > thresholds.kl:
        fails.append(f"mean_kl {metrics['mean_kl']:.4g} > threshold {thresholds.kl}")
    if metrics["ppl_delta"] > thresholds.ppl_delta:
        fails.append(f"ppl_delta {metrics['ppl_delta']:+.2%} > threshold "
                     f"{thresholds.ppl_delta:+.2%} (perplexity {metrics['ppl_artifact']:.3f} vs "
                     f"reference {metrics['ppl_reference']:.3f})")
    return fails


# Recorded vs re-measured metrics agree within this: llama.cpp or onnxruntime on another machine
# sum in another order (a top-1 flip or two, KL within a few %); an edited manifest is far off.
RECORDED_METRICS = ("top1_agreement", "mean_kl", "ppl_delta", "ppl_reference", "ppl_artifact",
                    "tokenizer_agreement")


def recorded_mismatches(recorded: Any, measured: dict[str, Any],
                        thresholds: Any = None) -> list[dict[str, Any]]:
    """[{"metric", "recorded", "measured"}] for every metric the manifest records that differs
    from the re-measured value (beyond 5 % relative / 0.005 absolute) or is not a finite number,
    and for every recorded threshold that is not a finite number (metric "threshold KEY": a
    build never records one; the thresholds applied are never the recorded ones anyway)."""
    if not isinstance(recorded, dict):
        return [{"metric": "(all)", "recorded": recorded, "measured": "a table of metrics"}]
    out = []
    for name in RECORDED_METRICS:
        if name not in recorded or name not in measured:
            continue
        rec, meas = recorded[name], measured[name]
        if not _finite(rec) or not math.isclose(rec, meas, rel_tol=0.05, abs_tol=0.005):
            out.append({"metric": name, "recorded": rec, "measured": meas})
    if isinstance(thresholds, dict):
        out += [{"metric": f"threshold {key}", "recorded": value, "measured": "a finite number"}
                for key, value in thresholds.items() if not _finite(value)]
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def verify_runner(runner, source: Path, recipe, dtype: str, threshold_overrides,
                  step: Callable[[str], None], reference: RecordedLogits | None = None,
                  draft_of: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Parity of `runner` against the float reference of `source` (see pipeline/verify.py);
    `reference`: `float_reference(source, runner)` recorded already (the build passes it on to
    `backend_fidelity` too). `draft_of(runner)`: the artifact's own draft, which the speculative
    check then uses instead of prompt lookup."""
    # Like with like: a runtime that always runs dense attention (llama.cpp on MiniCPM4) is
    # compared with the float model run dense; the manifest's `attention` says which.
    reference = reference or float_reference(source, runner, step)
    prompts = reference.prompts
    metrics = parity_metrics(reference, runner, prompts, step)
    metrics["attention"] = reference.attention
    metrics["tokenizer_agreement"] = tokenizer_agreement(reference.tokenizer, runner)
    thresholds = thresholds_for(recipe, dtype, threshold_overrides)
    failures = judge(metrics, thresholds)
    if metrics["tokenizer_agreement"] < 1.0:
        failures.append(f"tokenizer_agreement {metrics['tokenizer_agreement']:.2f} < 1.0 (the "
                        "artifact's runtime tokenises the prompts differently)")
    from .verify_speculative import speculative_check

    speculative = speculative_check(runner, prompts, step, draft_of=draft_of)
    if "failure" in speculative:
        failures.append(speculative["failure"])
    result = {"passed": not failures, "thresholds": thresholds.as_dict(), "metrics": metrics,
              "failures": failures, "prompt_lengths": [len(p) for p in prompts],
              "speculative": speculative}
    # A runner that is not the target's runtime (Core ML off macOS) names what it left unchecked
    # (`Runner.deferred`, () for every other runner).
    if runner.deferred:
        result["deferred"] = list(runner.deferred)
    return result


def backend_fidelity(backend, artifact: Path, runner, step,
                     reference: RecordedLogits | None = None) -> dict[str, Any] | None:
    """The backend's runtime against ArkInfer's reference model over the *same* quantised weights
    (the backend's `reference_weights(artifact)`: e.g. the Marlin checkpoint of a tensorrt
    artifact, or the GGUF file itself): isolates lowering/runtime error from quantisation error.
    Gate: top-1 agreement >= the backend's `fidelity_top1` (default 0.99). None when the backend
    has no reference weights (the reference backend: its runtime is the reference).

    Prompts: the float reference's when given (the same token ids for every comparison), else
    the verify prompts tokenised by the quantised reference's own tokenizer. A quantised
    reference that would not fit in memory in float32 runs block by block (streamed_reference.py).

    With `reference` (the float model's recorded logits, `float_reference`) it also records
    `quantisation`: the quantised weights against the float model (`QUALITY_KEYS`), the
    quantisation error alone, at the cost of the quantised reference's forwards only."""
    weights = backend.reference_weights(artifact)
    if weights is None:
        return None
    from arkinfer.pipeline.reference_runner import ReferenceRunner
    from arkinfer.pipeline.streamed_reference import StreamedReference, fits_in_memory

    dense = runner.fixed_attention == "dense"
    prompts = reference.prompts if reference is not None else None
    if fits_in_memory(Path(weights)):
        step(f"load the quantised reference ({Path(weights).name})")
        loaded = ReferenceRunner(weights, dense=dense)
        quantised = RecordedLogits(loaded)  # its logits serve both comparisons
        if prompts is None:
            prompts = verification_prompts(loaded.tokenizer, read_config(loaded.ckpt.path))
    else:  # dequantised to float32 it would not fit: block by block, the same logits
        step(f"quantised reference ({Path(weights).name}): streamed block by block")
        if prompts is None:  # with the float reference's prompts a GGUF is never imported
            from arkinfer.frontend.checkpoint import open_checkpoint

            ckpt = open_checkpoint(weights)
            prompts = verification_prompts(ckpt.tokenizer, read_config(ckpt.path))
        quantised = RecordedLogits(StreamedReference(Path(weights), prompts, None, dense, step),
                                   prompts)
    m = parity_metrics(quantised, runner, prompts, step)
    # a runner may set its own (the onnx runner built with int8 activations: gguf's 0.95)
    need = float(getattr(runner, "fidelity_top1", None) or backend.fidelity_top1)
    out = {"reference_weights": Path(weights).relative_to(artifact).as_posix()
           if Path(weights).is_relative_to(artifact) else str(weights),
           "top1_agreement": m["top1_agreement"], "mean_kl": m["mean_kl"],
           "max_abs_logit_diff": m["max_abs_logit_diff"], "threshold_top1": need,
           "passed": m["top1_agreement"] >= need}
    if not out["passed"]:
        out["failure"] = (f"fidelity top1_agreement {m['top1_agreement']:.4f} < threshold {need} "
                          f"(runtime vs the reference model on the same quantised weights)")
    if reference is not None:
        q = parity_metrics(reference, quantised, reference.prompts, step)
        out["quantisation"] = {key: q[key] for key in QUALITY_KEYS}
    return out
