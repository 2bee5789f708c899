"""`--calib self` (quant/calib_self.py): text the embedded demo model samples itself.

References independent of the code under test: the chat template rendered with plain jinja2 and
encoded with `tokenizers` (not arkinfer's tokenizer wrapper), numpy's float64 softmax of the
reference model's logits under Pearson's chi-square test, the schema file through jsonschema.
Every test samples the tiny demo model (a few seconds each on one thread).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import typer
from arkinfer.quant import calib_self
from arkinfer.quant.calib_corpus import calibration_domains
from arkinfer.quant.calib_data import load_calibration
from arkinfer.quant.weight import QuantError
from typer.testing import CliRunner

from arkinfer.cli import quantize
from arkinfer.frontend.checkpoint import load_model, open_checkpoint
from arkinfer.frontend.safetensors_io import weight_files
from arkinfer.generate import sample_next

DEMO = Path(__file__).resolve().parents[2] / "arkinfer" / "demo"
EOS = 2


@pytest.fixture(scope="module")
def ckpt():
    return open_checkpoint("demo")


@pytest.fixture(scope="module")
def model(ckpt):
    return load_model(ckpt)


def calib(ckpt, samples=6, seq_len=32, seed=0, notes=None):
    """--calib self on the demo model, cached under $ARKINFER_CACHE (the `cache` fixture)."""
    return load_calibration(ckpt.tokenizer, "self", samples, seq_len, seed, EOS,
                            checkpoint=ckpt, progress=notes.append if notes is not None else None)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("ARKINFER_CACHE", str(root))
    return root


def cache_file(root: Path) -> Path:
    (path,) = (root / "calib-self").glob("*.jsonl")
    return path


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[1:]]


def test_deterministic_for_a_seed_and_a_prefix_of_larger_runs(ckpt, tmp_path, monkeypatch):
    runs = {}
    for name, samples, seed in (("a", 6, 0), ("b", 6, 0), ("c", 6, 1), ("big", 12, 0)):
        monkeypatch.setenv("ARKINFER_CACHE", str(tmp_path / name))
        runs[name] = calib(ckpt, samples=samples, seed=seed)
    a, b, c = runs["a"], runs["b"], runs["c"]
    assert torch.equal(a.ids, b.ids) and a.sha256 == b.sha256
    assert not torch.equal(a.ids, c.ids)
    assert a.settings["source"] == "self" and a.samples == 6
    assert [d["domain"] for d in a.settings["domains"]] == list(calib_self.DOMAINS)
    assert all(d["samples"] == 1 for d in a.settings["domains"])
    # sample k of a domain depends on (seed, domain, k) only: 12 windows begin with the 6's samples
    small, big = records(cache_file(tmp_path / "a")), records(cache_file(tmp_path / "big"))
    for r in small:
        assert r in big


def test_builtin_and_self_deals_windows_over_both_and_reuses_the_self_cache(ckpt, cache):
    """`--calib builtin+self`: the built-in corpus's domains, then the self-sampled ones, windows
    dealt over all of them in turn; its self windows are the `self` run's own samples."""
    builtin = calibration_domains(None)
    d = len(builtin) + len(calib_self.DOMAINS)
    mixed = load_calibration(ckpt.tokenizer, "builtin+self", d, 32, 0, EOS, checkpoint=ckpt)
    names = [r["domain"] for r in mixed.settings["domains"]]
    assert names == [b.name for b in builtin] + list(calib_self.DOMAINS)
    assert mixed.samples == d and all(r["samples"] == 1 for r in mixed.settings["domains"])
    assert mixed.settings["source"] == "builtin+self" and "generation" in mixed.settings
    alone = calib(ckpt)  # 6 windows: one per self domain, from the same cache
    own = {r["domain"]: r["sha256"] for r in alone.settings["domains"]}
    assert {r["domain"]: r["sha256"] for r in mixed.settings["domains"][len(builtin):]} == own
    plain = load_calibration(ckpt.tokenizer, None, d, 32, 0, EOS)
    assert torch.equal(mixed.ids[:len(builtin)], plain.ids[:len(builtin)])


def test_cache_is_reused_without_generating(ckpt, cache, monkeypatch):
    notes: list[str] = []
    first = calib(ckpt, notes=notes)
    assert any("writing" in n for n in notes) and any("tokens/s" in n for n in notes)

    def boom(*args, **kwargs):
        raise AssertionError("generation ran although the cache holds the samples")

    monkeypatch.setattr(calib_self, "sample_group", boom)
    monkeypatch.setattr("arkinfer.frontend.checkpoint.load_model", boom)
    notes.clear()
    again = calib(ckpt, notes=notes)
    assert any(n.startswith("self-calibration: reusing ") for n in notes), notes
    assert torch.equal(first.ids, again.ids) and first.sha256 == again.sha256
    fewer = calib(ckpt, samples=3)  # a smaller request is a prefix of the cache
    assert fewer.samples == 3


def test_cache_grows_for_more_samples_and_equals_a_fresh_run(ckpt, cache, tmp_path, monkeypatch):
    monkeypatch.setattr(calib_self, "BATCH", 2)  # small groups, so 12 windows need new ones
    calib(ckpt, samples=6)
    before = records(cache_file(cache))
    rows = []
    real = calib_self.sample_group
    monkeypatch.setattr(calib_self, "sample_group",
                        lambda *a: rows.extend(a[3]) or real(*a))
    grown = calib(ckpt, samples=12)
    after = records(cache_file(cache))
    assert rows and len(rows) == len(after) - len(before)  # only the missing groups
    assert after[:len(before)] == before
    monkeypatch.setenv("ARKINFER_CACHE", str(tmp_path / "fresh"))
    assert calib(ckpt, samples=12).sha256 == grown.sha256
    # whole groups of BATCH samples, a group's rows sharing its prompt (group g: prompt g mod P)
    prompts = calib_self.seed_prompts(ckpt.tokenizer, 1)
    for d in calib_self.DOMAINS:
        mine = [r for r in after if r["domain"] == d]
        assert len(mine) % 2 == 0 and [r["index"] for r in mine] == list(range(len(mine)))
        for r in mine:
            prompt = prompts[d][r["index"] // 2 % len(prompts[d])]
            assert r["ids"][:r["prompt_tokens"]] == prompt


def test_damaged_cache_is_generated_again_with_a_note(ckpt, cache):
    first = calib(ckpt)
    path = cache_file(cache)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    bad_id = json.loads(lines[1])
    bad_id["ids"][0] = 10**9  # outside the vocabulary
    damaged = {"truncated": text[:len(text) - 25].encode(),
               "not JSON": b"\xff\xfe not json\n",
               "an id outside the vocabulary": "\n".join([lines[0], json.dumps(bad_id),
                                                          *lines[2:]]).encode()}
    for what, data in damaged.items():
        path.write_bytes(data)
        notes: list[str] = []
        again = calib(ckpt, notes=notes)
        assert any("is damaged" in n and "generating it again" in n for n in notes), what
        assert again.sha256 == first.sha256, what
        assert path.read_text(encoding="utf-8") == text, what
    assert not list(path.parent.glob("*.tmp"))  # written through a temporary file, renamed


def test_chat_seeds_go_through_the_chat_template(ckpt, cache):
    import jinja2
    from tokenizers import Tokenizer

    calib(ckpt, samples=6)
    template = (DEMO / "chat_template.jinja").read_text(encoding="utf-8")
    hf = Tokenizer.from_file(str(DEMO / "tokenizer.json"))
    prompts = {s.prompt for s in calib_self.SEEDS if s.prompt is not None}
    seen = set()
    for r in records(cache_file(cache)):
        if r["domain"] == "self-bos":
            assert r["ids"][0] == 1 and r["prompt_tokens"] == 1  # the bare BOS token <s>
            continue
        n = r["prompt_tokens"]
        prompt = next(p for p in prompts if p in r["text"])
        rendered = jinja2.Environment().from_string(template).render(
            messages=[{"role": "user", "content": prompt}], add_generation_prompt=True,
            bos_token="<s>")
        assert rendered.endswith("<|im_start|>assistant\n")
        assert r["ids"][:n] == hf.encode(rendered, add_special_tokens=False).ids
        assert r["text"].startswith(rendered)
        assert len(r["ids"]) > n  # the model wrote something after the prompt
        seen.add(prompt)
    assert any("春节" in p for p in seen) and any("Python" in p for p in seen)


def _first_token_logits(model, prompt: list[int]) -> np.ndarray:
    with torch.no_grad():
        logits, _ = model(torch.tensor([prompt]), torch.arange(len(prompt)), model.empty_cache(1))
    return logits[0, -1].double().numpy()


def _chi2_pvalue(counts: np.ndarray, logits: np.ndarray, temperature: float) -> float:
    """p-value of the draws `counts` [V] under numpy's float64 softmax(logits / T): Pearson's
    chi-square over the tokens expected at least 5 times plus one bin pooling the rest; the
    survival function of chi2(k) is the regularised upper incomplete gamma Q(k/2, x/2)."""
    z = logits / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    expected = p * counts.sum()
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 1e-9:
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_sampler_draws_from_the_softmax_at_temperature_one(ckpt, model):
    prompt = calib_self.seed_prompts(ckpt.tokenizer, 1)["self-chat"][0]
    logits = _first_token_logits(model, prompt)
    gen = torch.Generator().manual_seed(0)
    t = torch.from_numpy(logits).float()
    draws = [sample_next(t, calib_self.TEMPERATURE, calib_self.TOP_P, gen) for _ in range(20000)]
    counts = np.bincount(draws, minlength=logits.size)
    assert calib_self.TEMPERATURE == 1.0 and calib_self.TOP_P == 1.0
    assert _chi2_pvalue(counts, logits, 1.0) > 1e-3
    assert _chi2_pvalue(counts, logits, 0.6) < 1e-9  # the test can tell the demo's default T


def test_generated_first_tokens_follow_the_reference_model(ckpt, model):
    """Through the batched generation loop itself: the first token after <s>, 200 rows."""
    logits = _first_token_logits(model, [1])
    seeds = [calib_self.sample_seed(7, "self-bos", k) for k in range(200)]
    firsts = [row[1] for row in calib_self.sample_group(model, [1], 1, seeds, set())]
    counts = np.bincount(firsts, minlength=logits.size)
    assert _chi2_pvalue(counts, logits, 1.0) > 1e-3
    assert _chi2_pvalue(counts, logits, 0.6) < 1e-6


def _replay(model, prompt: list[int], row: list[int], seed: int, max_new: int,
            stop_ids: set[int]) -> list[int]:
    """What the per-row definition draws for `row`: at each step the batch-1 logits of the row so
    far (a fresh prefill, no cache, no batch) and `sample_next` with the row's own generator."""
    gen = torch.Generator().manual_seed(seed)
    out = list(prompt)
    for _ in range(max_new):
        with torch.no_grad():
            logits, _ = model(torch.tensor([row[:len(out)]]), torch.arange(len(out)),
                              model.empty_cache(1))
        out.append(sample_next(logits[0, -1], 1.0, 1.0, gen))
        if out[-1] in stop_ids:
            break
    return out


def test_batched_rows_equal_the_per_row_sampler(ckpt, model):
    """Each row of a batch, rows finishing early and dropped included, is what `sample_next`
    draws from a plain batch-1 forward of that row with its own generator."""
    prompt = calib_self.seed_prompts(ckpt.tokenizer, 1)["self-chat"][0]
    seeds = [calib_self.sample_seed(3, "self-chat", k) for k in range(8)]
    free = calib_self.sample_group(model, prompt, 12, seeds, set())
    assert all(len(r) == len(prompt) + 12 for r in free)
    assert len({tuple(r) for r in free}) > 1  # different streams
    stops = {r[len(prompt) + 1] for r in free[:3]}  # tokens some rows draw early
    steps: list[int] = []
    rows = calib_self.sample_group(model, prompt, 12, seeds, stops, steps.append)
    for row, seed in zip(rows, seeds):
        assert row == _replay(model, prompt, row, seed, 12, stops)
    assert len(rows[0]) <= len(prompt) + 2 and rows[0][-1] in stops  # finished early, kept
    assert sum(steps) == sum(len(r) - len(prompt) for r in rows)
    assert steps == sorted(steps, reverse=True) and steps[-1] < 8  # finished rows dropped


def test_model_key_follows_the_weights(tmp_path):
    copy = shutil.copytree(DEMO, tmp_path / "demo")
    key = calib_self.model_key(copy, weight_files(copy))
    assert key == calib_self.model_key(DEMO, weight_files(DEMO))
    shard = copy / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    assert calib_self.model_key(copy, weight_files(copy)) != key


def test_self_needs_the_model(ckpt):
    with pytest.raises(QuantError, match="samples the model itself") as exc:
        load_calibration(ckpt.tokenizer, "self", 4, 32, 0, EOS)
    assert "arkinfer quantize MODEL --calib self" in exc.value.hint
    with pytest.raises(QuantError, match="needs the model"):
        calibration_domains("self")


def test_quantize_calib_self_end_to_end_records_the_mix(cache, tmp_path):
    import jsonschema

    from arkinfer.pipeline.manifest import schema

    app = typer.Typer(pretty_exceptions_enable=False)
    app.command(name="quantize", help=quantize.HELP)(quantize.command)
    app.callback()(lambda: None)
    out = tmp_path / "q"
    result = CliRunner().invoke(app, ["quantize", "demo", "--method", "gptq", "--group-size",
                                      "64", "--calib", "self", "--samples", "8", "--seq-len",
                                      "32", "--seed", "3", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "self-calibration:" in result.stderr and "tokens/s" in result.stderr
    summary = json.loads((out / "quant_summary.json").read_text())
    cal = summary["calibration"]
    assert cal["source"] == "self" and cal["samples"] == 8 and cal["seed"] == 3
    mix = {d["domain"]: d["samples"] for d in cal["domains"]}
    assert mix == {"self-chat": 2, "self-chat-zh": 2, "self-code": 1, "self-math": 1,
                   "self-explain": 1, "self-bos": 1}
    gen = cal["generation"]
    assert gen["temperature"] == 1.0 and gen["top_p"] == 1.0 and gen["seed"] == 3
    assert gen["model_sha256"] == calib_self.model_key(DEMO, weight_files(DEMO))
    assert len(gen["seeds"]) == len(calib_self.SEEDS)
    assert summary["calibration_sha256"] == cal["sha256"]
    # the domain hashes name the cached text the windows came from
    path = cache_file(cache)
    assert gen["cache_file"] == path.name
    jsonschema.validate(cal, {"$schema": schema()["$schema"], "$defs": schema()["$defs"],
                              "$ref": "#/$defs/calibration"})
    again = CliRunner().invoke(app, ["quantize", "demo", "--method", "gptq", "--group-size",
                                     "64", "--calib", "self", "--samples", "8", "--seq-len",
                                     "32", "--seed", "3", "-o", str(tmp_path / "q2")])
    assert again.exit_code == 0, again.output
    assert "reusing" in again.stderr
    summary2 = json.loads((tmp_path / "q2" / "quant_summary.json").read_text())
    assert summary2["calibration_sha256"] == summary["calibration_sha256"]


def test_manifest_schema_takes_every_calibration_record(ckpt):
    import jsonschema
    from arkinfer.quant.calib.weight_only import NO_CALIBRATION
    from arkinfer.quant.calib_data import calibration_from_ids

    from arkinfer.pipeline.manifest import schema

    calibration = {"$schema": schema()["$schema"], "$defs": schema()["$defs"],
                   "$ref": "#/$defs/calibration"}
    builtin = load_calibration(ckpt.tokenizer, None, 8, 32, 0, EOS).describe()
    assert {d["domain"]: d["samples"] for d in builtin["domains"]}["code"] == 1
    for record in (builtin, dict(NO_CALIBRATION),
                   calibration_from_ids(torch.zeros(2, 4, dtype=torch.int64)).describe()):
        jsonschema.validate(record, calibration)
    bad = {**builtin, "domains": [{**builtin["domains"][0], "sha256": "not a hash"}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, calibration)


def test_build_calib_self_records_the_generation_in_the_manifest(cache, tmp_path):
    """The build's quantise stage samples the model too; the manifest keeps the record."""
    from arkinfer.cli.main import app

    result = CliRunner().invoke(app, ["build", "demo", "--target", "host", "--backend",
                                      "reference", "--quant",
                                      "gptq-q4_0", "--calib", "self", "--samples", "8",
                                      "--seq-len", "32", "-o", str(tmp_path / "art")])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "art" / "arkinfer.json").read_text())
    calibration = manifest["quant"]["calibration"]
    assert calibration["source"] == "self"
    assert calibration["generation"]["temperature"] == 1.0
    assert {d["domain"] for d in calibration["domains"]} >= {"self-chat", "self-bos"}
