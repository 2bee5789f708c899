"""The MLX artifact (backends/mlx: artifact.py, tensors.py, config.py, preflight.py, reference.py)
checked against the real consumer, unmodified mlx-lm 0.32.2 on MLX's CPU build.

Light: the demo MiniCPM4.1 (float, mlx4, RTN codes in gptq / awq layout) and tiny checkpoints of
every architecture: layout, mlx-lm loads and runs them and agrees with ArkInfer's reference model
on the same weights, GPTQ / AWQ -> MLX exact, plan bytes = artifact bytes, refusals, integrity.
Heavy: SmolLM2-135M mlx4 (bytes identical to mlx_lm.convert, greedy text), GPTQ-calibrated
demo, and the full `arkinfer build` + `verify` once the runtime's runner exists.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'arkinfer[mlx]')")
mlx_lm = pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install 'arkinfer[mlx]')")

from arkinfer.backends.mlx.backend import BACKEND  # noqa: E402
from arkinfer.quant import QuantRecipe, get_preset  # noqa: E402

from arkinfer.backend import LowerRequest  # noqa: E402
from arkinfer.errors import NotAvailableError, TargetError  # noqa: E402
from arkinfer.frontend.checkpoint import load, open_checkpoint  # noqa: E402
from arkinfer.frontend.demo import demo_model_path  # noqa: E402
from arkinfer.frontend.safetensors_io import read_header  # noqa: E402
from arkinfer.models.configs import tiny_config  # noqa: E402
from arkinfer.targets import load_target  # noqa: E402

EVAL_TEXT = Path(__file__).resolve().parents[3] / "arkinfer" / "data" / "corpus_eval.txt"


def quantise(src: Path, recipe, tmp: Path, samples: int = 8, seq_len: int = 128) -> Path:
    """The quantised folder `arkinfer build` lowers from (the pipeline's quantise stage)."""
    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.calib.weight_only import is_weight_only, quantize_weight_only
    from arkinfer.quant.calib_data import load_calibration
    from arkinfer.quant.export import export_folder

    ckpt = open_checkpoint(src)
    if is_weight_only(recipe):
        run = quantize_weight_only(ckpt, recipe, tmp / "work")
    else:
        eos = ckpt.config.eos_token_id
        data = load_calibration(ckpt.tokenizer, None, samples, seq_len, 0,
                                eos[0] if isinstance(eos, list) else eos,
                                max_positions=ckpt.config.max_position_embeddings,
                                hidden_size=ckpt.config.hidden_size)
        run = calibrate(ckpt, recipe, data, tmp / "work")
    return export_folder(run, tmp / "quantised")


def lower(src: Path, out: Path, recipe=None, dtype: str = "f16", folder: Path | None = None,
          **options: str):
    return BACKEND.lower(LowerRequest(folder or src, src, recipe, dtype,
                                      load_target("apple-m4"), out, options=options))


def tensors_of(art: Path) -> dict:
    arrays: dict = {}
    for f in sorted(art.glob("model*.safetensors")):
        arrays.update(mx.load(str(f)))
    return arrays


def mlx_lm_load(art: Path):
    """mlx_lm.load; MiniCPM needs the tokenizer workaround (see test_minicpm_tokenizer_...)."""
    import transformers

    minicpm = json.loads((art / "config.json").read_text())["model_type"] == "minicpm"
    return mlx_lm.load(str(art), tokenizer_config={"config": transformers.PreTrainedConfig()}
                       if minicpm else None)


def reference_logits(art: Path, ids: list[int]) -> np.ndarray:
    """ArkInfer's reference model on the artifact's exact weights (BACKEND.reference_weights)."""
    _, model = load(str(BACKEND.reference_weights(art)), dense=True)
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]), torch.arange(len(ids)), model.empty_cache(1))
    return logits[0].float().numpy()


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ARKINFER_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict[str, Path]:
    """Demo MiniCPM4.1 artifacts: f16, mlx4, and RTN codes stored in the gptq and awq layouts
    (the calibrated recipes' storage path, without minutes of calibration)."""
    tmp = tmp_path_factory.mktemp("mlx-demo")
    src = demo_model_path()
    out = {"src": src}
    lower(src, tmp / "f16")
    out["f16"] = tmp / "f16"
    for name, recipe in (("mlx4", get_preset("mlx4")),
                         ("gptq", QuantRecipe("rtn", "gptq", 4, 64, sym=True)),
                         ("awq", QuantRecipe("rtn", "awq", 4, 64, sym=False))):
        folder = quantise(src, recipe, tmp / f"q-{name}")
        out[f"{name}-folder"] = folder
        out[name] = tmp / name
        out[f"{name}-result"] = lower(src, tmp / name, recipe, "f32", folder)
    return out


def test_mlx4_layout(demo) -> None:
    art = demo["mlx4"]
    files = sorted(p.name for p in art.iterdir())
    assert files == sorted(["config.json", "model.safetensors", "model.safetensors.index.json",
                            "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                            "chat_template.jinja"])
    config = json.loads((art / "config.json").read_text())
    assert config["quantization"] == {"group_size": 64, "bits": 4, "mode": "affine",
                                      "lm_head": False}
    assert "quantization_config" not in config
    assert config["rope_scaling"]["rope_type"] == "longrope" and config["sparse_config"]
    header = read_header(art / "model.safetensors")
    q = "model.layers.0.mlp.down_proj"
    assert (header[f"{q}.weight"].dtype, header[f"{q}.weight"].shape) == ("U32", (128, 384 // 8))
    assert header[f"{q}.scales"].dtype == header[f"{q}.biases"].dtype == "F16"
    assert header[f"{q}.scales"].shape == (128, 384 // 64)
    assert header["lm_head.weight"].dtype == "BF16"  # skipped by the recipe: source dtype
    index = json.loads((art / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(header)
    result = demo["mlx4-result"]
    assert result.layers[q] == "mlx affine 4-bit g64 (mx.quantize, fp16 scales/biases)"
    assert any("recipe rtn 4-bit g64 asym -> mlx" in n for n in result.notes)
    assert result.toolchain["mlx"] == "0.32.4"


def test_mlx4_from_the_float_source_is_the_folder_path_byte_for_byte(demo, tmp_path) -> None:
    """mlx4 / mlx8 with rtn=mlx: build skips its quantise stage (`quantizes_in_lower`) and lower
    rounds the float source with mx.quantize; the artifact's bytes are those of the path through
    ArkInfer's quantised folder, whose codes it never used."""
    mlx4 = get_preset("mlx4")
    assert BACKEND.quantizes_in_lower(mlx4, {}) and BACKEND.quantizes_in_lower(get_preset("mlx8"), {})
    assert not BACKEND.quantizes_in_lower(mlx4, {"rtn": "folder"})
    assert not BACKEND.quantizes_in_lower(QuantRecipe("gptq", "mlx", 4, 64, sym=False), {})
    result = lower(demo["src"], tmp_path / "a", mlx4, "f32")   # model_dir = the float source
    folder_path = demo["mlx4-result"]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == \
        (demo["mlx4"] / "model.safetensors").read_bytes()
    assert result.layers == folder_path.layers and folder_path.quant is None
    # 4-bit codes + an fp16 scale and bias per 64 weights
    assert result.quant["bits_per_weight"] == 4.5 and "mx.quantize" in result.quant["quantised_by"]


@pytest.mark.parametrize("kind", ["f16", "mlx4"])
def test_mlx_lm_runs_demo_like_the_reference(demo, kind: str) -> None:
    """Unmodified mlx-lm (its own minicpm model: scale_emb, scale_depth, dim_model_base,
    LongRoPE) loads and generates; its logits agree with ArkInfer's reference model on the same
    weights (mlx-lm computes in fp16 activations, hence top-1 rather than equality)."""
    art = demo[kind]
    model, tokenizer = mlx_lm_load(art)
    text = mlx_lm.generate(model, tokenizer, prompt="Once upon a time", max_tokens=8)
    assert isinstance(text, str) and text
    ids = tokenizer.encode(EVAL_TEXT.read_text(encoding="utf-8")[:1500],
                           add_special_tokens=False)[:160]
    ours = reference_logits(art, ids)
    theirs = np.array(model(mx.array([ids]))[0].astype(mx.float32))
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() >= 0.98
    assert np.abs(ours - theirs).max() < 0.2


def test_minicpm_tokenizer_load_fails_in_transformers(demo) -> None:
    """Found by running: plain mlx_lm.load() of a MiniCPM LongRoPE folder fails in transformers
    5.x's tokenizer loading (no 'minicpm' config class; the generic config reads
    max_position_embeddings before it sets it). The notes say so and give the workaround; when
    this starts to pass, drop the note in preflight.compat_notes."""
    with pytest.raises(AttributeError, match="max_position_embeddings"):
        mlx_lm.load(str(demo["f16"]))
    assert any("tokenizer_config" in n for n in demo["mlx4-result"].notes)


@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_gptq_awq_codes_become_mlx_affine_exactly(demo, fmt: str) -> None:
    """mx.dequantize of every MLX linear == the gptq / awq folder's dequantised weight, bit for
    bit (fp32 scales and biases: scale s, bias -z*s, no second rounding)."""
    from arkinfer.quant.load import dequantized_state

    expect = dequantized_state(demo[f"{fmt}-folder"])
    arrays = tensors_of(demo[fmt])
    linears = [n.removesuffix(".scales") for n in arrays if n.endswith(".scales")]
    assert len(linears) == 4 * 7
    for owner in linears:
        s, b = arrays[f"{owner}.scales"], arrays[f"{owner}.biases"]
        assert s.dtype == b.dtype == mx.float32
        got = np.array(mx.dequantize(arrays[f"{owner}.weight"], s, b, group_size=64, bits=4))
        assert np.array_equal(got, expect[f"{owner}.weight"]), owner
    assert any(f"from {fmt}, float32 scales/biases, exact" in v
               for v in demo[f"{fmt}-result"].layers.values())


@pytest.mark.parametrize("kind,quant", [("mlx4", "mlx4"), ("f16", "f16")])
def test_plan_bytes_are_the_artifact_bytes(demo, kind: str, quant: str) -> None:
    """`arkinfer plan --quant mlx4` sizes the weights exactly as the artifact stores them."""
    from arkinfer.latency import ModelCost

    raw = json.loads((demo["src"] / "config.json").read_text())
    cost = ModelCost.from_config(raw, quant=get_preset("mlx4") if quant == "mlx4" else quant)
    stored = sum(i.nbytes for f in demo[kind].glob("model*.safetensors")
                 for i in read_header(f).values())
    assert cost.weight_bytes == stored


ARCHS = {
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "minicpm-tied": ("minicpm", {"tie_word_embeddings": True, "rope_scaling": {
        "rope_type": "longrope", "long_factor": [1.0 + 0.5 * i for i in range(16)],
        "short_factor": [1.0 + 0.5 * i for i in range(16)],
        "original_max_position_embeddings": 64}}),
}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_mlx_lm_model_equals_reference(tiny_checkpoint, tmp_path, arch: str) -> None:
    """f32 artifacts of every architecture: mlx-lm's model == ArkInfer's reference to 1e-4.
    A tied MiniCPM is written untied (mlx-lm cannot load a tied one: its sanitize adds
    lm_head.weight, and its tied path would skip the logit scale)."""
    from mlx_lm.utils import load_model

    model_type, overrides = ARCHS[arch]
    src = tiny_checkpoint(model_type, **overrides)
    result = lower(src, tmp_path / "art", dtype="f32")
    ids = list(range(3, 43))
    model, _ = load_model(tmp_path / "art")
    theirs = np.array(model(mx.array([ids]))[0])
    assert np.abs(reference_logits(tmp_path / "art", ids) - theirs).max() < 1e-4
    if arch == "minicpm-tied":
        assert json.loads((tmp_path / "art" / "config.json").read_text())[
            "tie_word_embeddings"] is False
        assert any("lm_head.weight" in n for n in result.notes)


def test_mlx_lm_longrope_uses_long_factor_only(tiny_checkpoint, tmp_path) -> None:
    """Found by running: mlx-lm's SuScaledRoPE always applies long_factor, ArkInfer the short
    one below original_max_position_embeddings, so with different lists they disagree on short
    contexts (the notes say so; MiniCPM4.1's lists are equal)."""
    from mlx_lm.utils import load_model

    result = lower(tiny_checkpoint("minicpm"), tmp_path / "art", dtype="f32")
    ids = list(range(3, 43))
    model, _ = load_model(tmp_path / "art")
    theirs = np.array(model(mx.array([ids]))[0])
    assert np.abs(reference_logits(tmp_path / "art", ids) - theirs).max() > 1e-3
    assert any("the lists differ here" in n for n in result.notes)


def test_shards_and_index_load_in_mlx_lm(tiny_checkpoint, tmp_path) -> None:
    from mlx_lm.utils import load_model

    src = tiny_checkpoint("llama")
    files = lower(src, tmp_path / "art", dtype="f32", shard_mb="0.2").files
    shards = [f for f in files if f.startswith("model-")]
    assert len(shards) >= 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((tmp_path / "art" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    model, _ = load_model(tmp_path / "art")
    assert np.isfinite(np.array(model(mx.array([[1, 2, 3]])))).all()


def test_layer_the_group_does_not_divide_is_a_plan_time_error(tiny_checkpoint) -> None:
    """intermediate_size 80: no MLX group size divides down_proj's rows; `build` stops at plan
    time naming the layer (resolve keeps the recipe and notes the float fallback, the backend
    refuses it)."""
    from arkinfer.pipeline.plan import resolve_plan

    src = tiny_checkpoint("llama", intermediate_size=80)
    with pytest.raises(TargetError, match=r"model\.layers\.0\.mlp\.down_proj \[128x80\]"):
        resolve_plan(str(src), target="apple-m4", quant="mlx4")
    raw = tiny_config("llama", intermediate_size=96)
    with pytest.raises(TargetError, match=r"down_proj \[128x96\].*layers fail") as err:
        BACKEND.preflight(raw, get_preset("mlx4"), load_target("apple-m4"), "f32")
    assert "group size of 32" in err.value.hint


@pytest.mark.parametrize("recipe,match", [
    (QuantRecipe("gptq", "gptq", 4, 64, sym=True, desc_act=True), "act-order"),
    (QuantRecipe("gptq", "gptq", 4, 16, sym=True), "group_size=16"),
    (get_preset("q4_0"), "gguf-q4_0"),
])
def test_recipes_mlx_cannot_store_are_refused(recipe, match: str) -> None:
    with pytest.raises(TargetError, match=match):
        BACKEND.preflight(tiny_config("llama"), recipe, None, "f32")


def test_mlx_missing_is_one_error_with_the_install_command(monkeypatch) -> None:
    import importlib.util

    from arkinfer.pipeline.plan import resolve_plan

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.split(".")[0] == "mlx" else real(name, *a))
    assert not BACKEND.available()
    with pytest.raises(NotAvailableError, match="backend 'mlx' is not installed") as err:
        resolve_plan("demo", target="apple-m4", quant="mlx4")
    assert "pip install 'arkinfer[mlx]'" in err.value.hint


def test_a_changed_byte_fails_the_integrity_check(demo, tmp_path) -> None:
    """verify hashes every artifact file (pipeline/manifest.py); flipping one byte of the MLX
    weights is caught before any backend code runs."""
    import shutil

    from arkinfer.pipeline import manifest as mf
    from arkinfer.pipeline.artifact import check_integrity
    from arkinfer.pipeline.verify import VerifyError

    art = tmp_path / "art"
    shutil.copytree(demo["mlx4"], art)
    manifest = {"files": mf.file_hashes(art)}
    check_integrity(art, manifest)
    path = art / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(VerifyError, match="model.safetensors: sha256 differs"):
        check_integrity(art, manifest)


# ------------------------------------------------------------------------------------- heavy
@pytest.fixture(scope="module")
def smollm2_mlx4(tmp_path_factory) -> tuple[Path, Path]:
    from arkinfer.testing.smollm2 import smollm2_hf_dir

    tmp = tmp_path_factory.mktemp("mlx-smollm2")
    src = smollm2_hf_dir()
    recipe = get_preset("mlx4")  # group 64: SmolLM2's 576-wide rows
    lower(src, tmp / "art", recipe, "f32", quantise(src, recipe, tmp / "q"))
    return src, tmp / "art"


@pytest.mark.heavy
def test_smollm2_mlx4_is_mlx_lm_convert_byte_for_byte(smollm2_mlx4, tmp_path) -> None:
    """RTN presets use MLX's own quantiser: every packed weight, scale and bias equals what
    `mlx_lm.convert(..., q_group_size=64, q_bits=4, dtype="float16")` writes (630 tensors)."""
    src, art = smollm2_mlx4
    mlx_lm.convert(str(src), str(tmp_path / "conv"), quantize=True, q_group_size=64, q_bits=4,
                   dtype="float16")
    ours, theirs = tensors_of(art), tensors_of(tmp_path / "conv")
    packed = [n for n in ours if n.endswith((".scales", ".biases")) or ours[n].dtype == mx.uint32]
    assert len(packed) == 30 * 7 * 3
    for name in packed:
        assert ours[name].dtype == theirs[name].dtype and mx.array_equal(ours[name],
                                                                         theirs[name]), name


@pytest.mark.heavy
def test_smollm2_mlx4_generates_in_mlx_lm(smollm2_mlx4) -> None:
    _, art = smollm2_mlx4
    model, tokenizer = mlx_lm.load(str(art))  # no workaround needed for Llama
    text = mlx_lm.generate(model, tokenizer, prompt="The capital of France is", max_tokens=12)
    assert "Paris" in text
    ids = tokenizer.encode(EVAL_TEXT.read_text(encoding="utf-8")[:3000],
                           add_special_tokens=False)[:256]
    ours = reference_logits(art, ids)
    theirs = np.array(model(mx.array([ids]))[0].astype(mx.float32))
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() >= 0.97


@pytest.mark.heavy
def test_demo_gptq_calibrated_is_exact(tmp_path) -> None:
    """A real GPTQ calibration (preset gptq, g128) stored as MLX affine: exact."""
    from arkinfer.quant.load import dequantized_state

    src, recipe = demo_model_path(), get_preset("gptq")
    folder = quantise(src, recipe, tmp_path / "q", samples=4, seq_len=64)
    lower(src, tmp_path / "art", recipe, "f32", folder)
    expect, arrays = dequantized_state(folder), tensors_of(tmp_path / "art")
    for owner in [n.removesuffix(".scales") for n in arrays if n.endswith(".scales")]:
        got = mx.dequantize(arrays[f"{owner}.weight"], arrays[f"{owner}.scales"],
                            arrays[f"{owner}.biases"], group_size=128, bits=4)
        assert np.array_equal(np.array(got), expect[f"{owner}.weight"]), owner


@pytest.mark.heavy
def test_build_verify_and_a_changed_byte(tmp_path) -> None:
    """`arkinfer build demo --target apple-m4 --quant mlx4` passes its gate with ArkInfer's MLX
    runner, `verify` passes, and fails after one byte of the weights changes."""
    pytest.importorskip("arkinfer.backends.mlx.runner",
                        reason="the MLX runtime's runner (backends/mlx/runner.py) is not there")
    from arkinfer.pipeline.artifact import verify_artifact
    from arkinfer.pipeline.build import build
    from arkinfer.pipeline.plan import resolve_plan
    from arkinfer.pipeline.verify import VerifyError

    result = build(resolve_plan("demo", target="apple-m4", quant="mlx4", out=tmp_path / "a"))
    assert result.manifest["verification"]["passed"]
    assert verify_artifact(result.path)["passed"]
    path = result.path / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(VerifyError, match="sha256 differs"):
        verify_artifact(result.path)
