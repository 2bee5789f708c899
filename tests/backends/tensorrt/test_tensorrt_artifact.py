"""tensorrt backend on the demo model (MiniCPM4.1 architecture with sparse_config): the artifact
runs in onnxruntime with the reference model's logits for the same quantised weights; decode ==
prefill; the MatMulNBits path == the ONNX-function path; the hf/ folder passes vLLM's loader rules;
Marlin tensors unpack to the GPTQ codes and scales exactly; preflight gates."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime", reason="pip install 'arkinfer[onnx]'")

from arkinfer.quant import QuantRecipe, get_format
from arkinfer.quant.calib.stream import calibrate
from arkinfer.quant.calib_data import calibration_from_ids
from arkinfer.quant.export import export_folder
from arkinfer.quant.formats.marlin import gptq_to_marlin
from arkinfer.quant.load import load_quantized

from arkinfer.backend import LowerRequest, get_backend
from arkinfer.errors import TargetError
from arkinfer.frontend.demo import demo_model_path
from arkinfer.frontend.safetensors_io import LazyWeights, weight_files
from arkinfer.targets import load_target

RECIPES = {"marlin": QuantRecipe("gptq", "marlin", 4, 128, sym=True),
           "gptq": QuantRecipe("gptq", "gptq", 4, 128, sym=True),
           "awq": QuantRecipe("awq", "awq", 4, 64, sym=False)}
PROMPTS = ["Once upon a time there was a little robot who loved to read books about the sea.",
           "The weather today is sunny, and the children are playing in the park near the river.",
           "Question: what is the capital of France? Answer: the capital of France is Paris."]
BACKEND = get_backend("tensorrt")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """fmt -> quantised demo folder (GPTQ / AWQ calibration on random ids: seconds)."""
    root = tmp_path_factory.mktemp("trt-quant")
    ids = torch.randint(0, 2048, (4, 48), generator=torch.Generator().manual_seed(0))
    out = {}
    for fmt, recipe in RECIPES.items():
        run = calibrate(demo_model_path(), recipe, calibration_from_ids(ids), root / f"w-{fmt}")
        out[fmt] = export_folder(run, root / f"demo-{fmt}")
    return out


def _build(folder: Path, fmt: str, out: Path):
    request = LowerRequest(model_dir=folder, source_dir=demo_model_path(), recipe=RECIPES[fmt],
                           dtype="bf16", target=load_target("jetson-orin"), out_dir=out)
    return BACKEND.lower(request)


@pytest.fixture(scope="module")
def artifacts(folders, tmp_path_factory):
    root = tmp_path_factory.mktemp("trt-art")
    return {fmt: (root / fmt, _build(folder, fmt, root / fmt)) for fmt, folder in folders.items()}


def _reference_logits(folder: Path, ids: list[int]) -> torch.Tensor:
    model = load_quantized(folder)
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]), torch.arange(len(ids)), model.empty_cache(1))
    return logits[0]


def test_artifact_files_and_metadata(artifacts):
    import onnx

    art, result = artifacts["marlin"]
    for f in ("model.onnx", "model.onnx.data", "tokenizer.json", "hf/config.json"):
        assert (art / f).is_file() and f in result.files
    model = onnx.load(str(art / "model.onnx"), load_external_data=False)
    props = {p.key: p.value for p in model.metadata_props}
    assert props["arkinfer.recipe"].endswith("-> marlin") and props["arkinfer.version"]
    assert json.loads(props["arkinfer.sparse_config"])["dense_len"] == 1024
    assert {o.version for o in model.opset_import if o.domain == ""} == {21}
    fns = {"InfLLMv2Attention", "MarlinLinear", "RMSNorm", "SkipRMSNorm"}
    assert {f.name for f in model.functions} == fns
    used = {n.op_type for n in model.graph.node if n.domain == "arkinfer"}
    assert used == fns
    assert sum(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer) > 20
    assert "InfLLM v2" in result.ops["attention"]
    assert all(v.startswith("marlin 4-bit g128") for v in result.layers.values())


def test_int8_activation_path_runs_and_stays_close(artifacts):
    """accuracy_level=4 (MatMulNBits with int8 activations, the fast CPU path) really changes the
    arithmetic, and stays close to the fp32 path: same top token on most positions."""
    from arkinfer.backends.onnx.runner import OnnxRunner

    art = artifacts["awq"][0]
    exact = OnnxRunner(art, ops="contrib", threads=1)
    int8 = OnnxRunner(art, ops="contrib", threads=1, accuracy_level=4)
    ids = exact.tokenize(PROMPTS[0])
    a, b = exact.window_logits(ids), int8.window_logits(ids)
    assert not torch.equal(a, b)
    assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.9
    assert float((a - b).abs().max()) < 0.1 * float(a.abs().max())


@pytest.mark.parametrize("fmt", ["marlin", "gptq", "awq"])
def test_onnxruntime_matches_reference(artifacts, folders, fmt):
    runner = BACKEND.load(artifacts[fmt][0], threads=1)
    agree, total, worst = 0, 0, 0.0
    for text in PROMPTS:
        ids = runner.tokenize(text)
        got, want = runner.window_logits(ids), _reference_logits(folders[fmt], ids)
        agree += int((got.argmax(-1) == want.argmax(-1)).sum())
        total += len(ids)
        worst = max(worst, float((got - want).abs().max()))
    print(f"{fmt}: top-1 agreement {agree}/{total}, max abs logit diff {worst:.3g}")
    assert agree / total >= 0.99
    assert worst < 1e-3


def _reference_steps(model, ids: list[int], prompt: int) -> torch.Tensor:
    """Logits of the reference model prefilled with ids[:prompt], then decoding one by one."""
    cache = model.empty_cache(1)
    with torch.no_grad():
        _, cache = model(torch.tensor([ids[:prompt]]), torch.arange(prompt), cache)
        out = []
        for p in range(prompt, len(ids)):
            logits, cache = model(torch.tensor([[ids[p]]]), torch.tensor([p]), cache)
            out.append(logits[0, -1])
    return torch.stack(out)


def test_decode_equals_prefill_and_crosses_dense_len(artifacts):
    """Past the demo's dense_len (1024) attention is InfLLM v2 with compressed-key caches carried
    between calls: decode == the one-shot prefill there, and decode steps that cross dense_len
    match the reference model making the same calls (dense below, sparse from 1024 on)."""
    runner = BACKEND.load(artifacts["marlin"][0], ops="function", threads=1)
    ids = torch.randint(3, 2048, (1070,), generator=torch.Generator().manual_seed(1)).tolist()
    window = runner.window_logits(ids)
    runner.reset()
    runner.prefill(ids[:1050])
    steps = torch.stack([runner.decode(t) for t in ids[1050:]])
    torch.testing.assert_close(steps, window[1050:], atol=2e-4, rtol=1e-4)
    model = load_quantized(artifacts["marlin"][0] / "hf")
    with torch.no_grad():
        ref, _ = model(torch.tensor([ids]), torch.arange(len(ids)), model.empty_cache(1))
    assert (window.argmax(-1) == ref[0].argmax(-1)).float().mean() >= 0.99
    runner.reset()
    runner.prefill(ids[:1016])
    crossing = torch.stack([runner.decode(t) for t in ids[1016:1030]])
    want = _reference_steps(model, ids[:1030], 1016)
    assert (crossing.argmax(-1) == want.argmax(-1)).all()
    torch.testing.assert_close(crossing, want, atol=1e-3, rtol=1e-3)


def test_contrib_path_equals_function_path(artifacts):
    for fmt in ("marlin", "awq"):
        fast = BACKEND.load(artifacts[fmt][0], ops="contrib", threads=1)
        slow = BACKEND.load(artifacts[fmt][0], ops="function", threads=1)
        assert fast.replaced == 28 and slow.replaced == 0 and not fast.notes
        assert fast.packed_siblings == 8  # per layer q/k/v (InfLLM v2 reads them) and gate/up
        ids = fast.tokenize(PROMPTS[0])
        torch.testing.assert_close(fast.window_logits(ids), slow.window_logits(ids),
                                   atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fmt", ["marlin", "gptq", "awq"])
def test_hf_folder_passes_vllm_rules(artifacts, fmt, tmp_path):
    from arkinfer.backends.tensorrt.vllm_rules import method_of, vllm_problems

    hf = artifacts[fmt][0] / "hf"
    assert vllm_problems(hf) == []
    qcfg = json.loads((hf / "config.json").read_text())["quantization_config"]
    assert method_of(qcfg) == {"marlin": "marlin", "gptq": "gptq_marlin", "awq": "awq"}[fmt]
    # the check is not vacuous: a bf16 marlin config and a missing field are caught
    broken = tmp_path / "broken"
    shutil.copytree(hf, broken)
    raw = json.loads((broken / "config.json").read_text())
    raw["torch_dtype"] = "bfloat16"
    raw["quantization_config"].pop("group_size")
    (broken / "config.json").write_text(json.dumps(raw))
    problems = vllm_problems(broken)
    assert any("group_size" in p for p in problems)
    if fmt in ("marlin", "awq"):
        assert any("float16" in p for p in problems)


def test_marlin_tensors_unpack_to_gptq_codes_exactly(folders, artifacts):
    """The same weights in GPTQ layout, repacked by data movement (gptq_to_marlin), equal the
    artifact's Marlin tensors; unpacking those gives the GPTQ codes and scales bit for bit."""
    gptq = LazyWeights(weight_files(folders["gptq"]))
    marlin = LazyWeights(weight_files(artifacts["marlin"][0] / "hf"))
    fmt_g, fmt_m = get_format("gptq"), get_format("marlin")
    owners = sorted(n[:-len(".B")] for n in marlin.names() if n.endswith(".B"))
    assert len(owners) == 28
    for owner in owners:
        g = {k: gptq.get(f"{owner}.{k}").numpy() for k in ("qweight", "qzeros", "scales", "g_idx")}
        m = {k: marlin.get(f"{owner}.{k}").numpy() for k in ("B", "s")}
        n, k = g["scales"].shape[1], g["qweight"].shape[0] * 8
        repacked = gptq_to_marlin(g)
        # two calibrations of identical settings are deterministic: same codes, same tensors
        assert np.array_equal(repacked["B"], m["B"]) and np.array_equal(repacked["s"], m["s"])
        qg = fmt_g.unpack(g, n, k, bits=4, group_size=128)
        qm = fmt_m.unpack(m, n, k, group_size=128)
        assert torch.equal(qg.codes, qm.codes) and torch.equal(qg.scales, qm.scales)


def test_preflight_gates():
    demo = json.loads((demo_model_path() / "config.json").read_text())
    orin = load_target("jetson-orin")
    notes = BACKEND.preflight(demo, RECIPES["marlin"], orin)
    assert any("sm_87" in n for n in notes)
    smol = dict(demo, hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                num_key_value_heads=3, head_dim=64)
    smol.pop("rope_scaling", None)
    with pytest.raises(TargetError, match=r"model\.layers\.0\.self_attn\.q_proj.*in_features=576"):
        BACKEND.preflight(smol, RECIPES["marlin"], orin)
    with pytest.raises(TargetError, match="f8_e4m3.*sm_89"):
        BACKEND.preflight(demo, RECIPES["marlin"], orin, dtype="f8_e4m3")
    with pytest.raises(TargetError, match="4-bit"):
        BACKEND.preflight(demo, QuantRecipe("gptq", "gptq", 8, 128), orin)
    with pytest.raises(TargetError, match="gguf-q4_0"):
        BACKEND.preflight(demo, QuantRecipe("rtn", "gguf-q4_0", 4, 32), orin)
