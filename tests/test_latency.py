"""The latency model against numbers computed by hand from docs/targets.md and
docs/model.md (MiniCPM4.1-8B: hidden 4096, 32 layers, 32 q / 2 kv heads x 128, intermediate
16384, vocab 73448, untied lm_head, bf16)."""

from __future__ import annotations

import pytest

from arkinfer.errors import ConfigError, TargetError
from arkinfer.latency import ModelCost, predict
from arkinfer.latency.plan import make_plan
from arkinfer.latency.source import KNOWN_CONFIGS
from arkinfer.models.configs import tiny_config
from arkinfer.targets import load_target

RAW = KNOWN_CONFIGS["minicpm4.1-8b"]
H, I, V, L, D = 4096, 16384, 73448, 32, 128
LINEAR = L * (2 * H * H + 2 * 2 * D * H + 3 * H * I)  # q, o + k, v + gate, up, down
LM_HEAD = V * H
NORMS = (2 * L + 1) * H


@pytest.fixture(scope="module")
def marlin():
    return ModelCost.from_config(RAW, quant="marlin")


@pytest.fixture(scope="module")
def orin():
    return load_target("jetson-orin")


def test_parameters_and_kv_match_the_spec(marlin):
    assert marlin.params == LINEAR + 2 * LM_HEAD + NORMS == 8_185_253_888  # "8.185 B"
    assert marlin.params_linear == LINEAR and marlin.params_active == LINEAR + LM_HEAD
    assert marlin.kv_bytes_per_token == 2 * L * 2 * D * 2 == 32 * 1024  # "32 KiB/token"
    assert marlin.visible_keys == (64 + 2048 // 64) * 64 == 6144


def test_weight_bytes_per_format(marlin):
    # marlin g128: 4-bit codes + one fp16 scale per 128 weights; lm_head skipped -> bf16
    assert marlin.bytes_of("linear") == LINEAR * 4 // 8 + LINEAR // 128 * 2 == 3_910_139_904
    assert marlin.lm_head_bytes == LM_HEAD * 2
    assert marlin.weight_bytes_step == 3_910_139_904 + LM_HEAD * 2 + NORMS * 2 + H * 2
    q4_0 = ModelCost.from_config(RAW, quant="q4_0")  # 18 bytes per 32 weights = 4.5 bits
    assert q4_0.bytes_of("linear") == LINEAR // 32 * 18 and q4_0.linear_bits_per_weight == 4.5
    f16 = ModelCost.from_config(RAW, quant="f16")
    assert f16.weight_bytes == 2 * f16.params
    gptq = ModelCost.from_config(RAW, quant="gptq")  # + 4-bit zeros per group + int32 g_idx
    g_idx = 4 * L * (6 * H + I)  # one int32 per input column: q k v o gate up (H), down (I)
    assert gptq.bytes_of("linear") == LINEAR // 2 + LINEAR // 128 * (2 + 0.5) + g_idx


def test_decode_at_4k_is_37ish_and_exact(marlin, orin):
    p = predict(marlin, orin, ctx=4096, prompt=512)
    step = marlin.weight_bytes_step + 32 * 1024 * 4096
    assert p.decode.bytes == step
    assert p.decode_tok_s == pytest.approx(0.79 * 204.8e9 / step, rel=1e-12)  # 34.8 tok/s
    assert p.bound == "bandwidth"
    # docs/targets.md: "~4.4 GB per decode step -> AGX Orin (η 0.8) ≈ 37 tok/s at short context"
    assert 37 * 0.9 < p.decode_tok_s < 37 * 1.1
    short = predict(marlin, orin, ctx=0, prompt=1)
    assert 37 * 0.95 < short.decode_tok_s < 37 * 1.05
    # decode FLOPs: 2 · active params + attention 4 · L · heads · D per key seen (4097 keys)
    assert p.decode.flops == 2 * (LINEAR + LM_HEAD) + 4 * L * 32 * D * 4097
    assert p.decode.t_compute == pytest.approx(p.decode.flops / (0.5 * 42.5e12))


def test_sparse_drops_much_less_than_dense_from_4k_to_128k(marlin, orin):
    def tps(ctx, attention):
        return predict(marlin, orin, ctx=ctx, prompt=1, attention=attention).decode_tok_s
    dense_drop = 1 - tps(131072, "dense") / tps(4096, "dense")
    sparse_drop = 1 - tps(131072, "sparse") / tps(4096, "sparse")
    assert dense_drop > 0.4 and sparse_drop < 0.1 and sparse_drop < dense_drop / 4
    # KV read at 128K: dense 2·L·kv·D·ctx·2; InfLLM v2 L·kv·D·2·(2·6144 + ctx/16 + ctx/64)
    assert marlin.kv_read_bytes(131072, False) == 32 * 1024 * 131072
    assert marlin.kv_read_bytes(131072, True) == L * 2 * D * 2 * (2 * 6144 + 8192 + 2048)
    # docs/infllmv2.md §8: "~12x at 128K and ~4.5x at 32K" for decode attention
    assert marlin.kv_read_bytes(131072, False) / marlin.kv_read_bytes(131072, True) == \
        pytest.approx(11.6, abs=0.1)
    assert marlin.kv_read_bytes(32768, False) / marlin.kv_read_bytes(32768, True) == \
        pytest.approx(4.4, abs=0.1)
    # below dense_len (8192) "sparse" runs dense
    p = predict(marlin, orin, ctx=4096, prompt=1, attention="sparse")
    assert p.decode_attention == "dense"


def test_prefill_is_the_spec_formula(marlin, orin):
    t = 4096
    p = predict(marlin, orin, ctx=t, prompt=t)
    # 2 · linear params · T + last-token lm_head + 2 · L · heads · D · T(T+1) (causal)
    flops = 2 * LINEAR * t + 2 * LM_HEAD + 2 * L * 32 * D * t * (t + 1)
    assert p.prefill.flops == flops
    assert p.prefill.bound == "compute"
    assert p.ttft_s == pytest.approx(flops / (0.5 * 42.5e12))
    assert p.prefill_tok_s == pytest.approx(t / p.ttft_s)
    # sparse 128K prefill: each query sees <= 6144 keys plus its compressed keys
    long = predict(marlin, orin, ctx=131072, prompt=131072, attention="sparse")
    dense = predict(marlin, orin, ctx=131072, prompt=131072, attention="dense")
    assert long.prefill_attention == "sparse" and long.ttft_s < dense.ttft_s / 2
    # MiniCPM4 report: ~1100 tok/s prefill at 128K on AGX Orin (sparse + int4)
    assert 800 < long.prefill_tok_s < 1400


def test_memory_fit_rpi5_fp16_no_int4_yes(monkeypatch):
    monkeypatch.setenv("ARKINFER_LLAMACPP", "upstream")  # even where the InfLLM v2 build exists
    rpi5 = load_target("rpi5")
    f16 = predict(ModelCost.from_config(RAW, quant="f16"), rpi5, ctx=4096, prompt=512)
    assert not f16.fits and f16.memory.weights == 2 * 8_185_253_888
    assert f16.memory.total > f16.memory.device == 8 * 2**30
    q4 = predict(ModelCost.from_config(RAW, quant="q4_0"), rpi5, ctx=4096, prompt=512)
    assert q4.fits and q4.memory.kv_cache == 32 * 1024 * 4096
    assert q4.memory.total == q4.memory.weights + q4.memory.kv_cache + q4.memory.workspace
    plan = make_plan("minicpm4.1-8b", "rpi5", "fp16")
    err = plan.refusal()
    assert err is not None and "does not fit rpi5-8gb" in err.message and "q4_0" in err.hint
    plan = make_plan("minicpm4.1-8b", "rpi5", "int4")
    assert plan.quant == "q4_0" and plan.refusal() is None
    assert plan.sparse_supported is False  # upstream llama.cpp runs dense only
    assert [p.fits for p in plan.rows] == [True, True, False]  # 128K dense KV is 4.3 GB


def test_tied_embeddings_and_quantised_lm_head():
    raw = tiny_config("llama", tie_word_embeddings=True, torch_dtype="float32")
    cost = ModelCost.from_config(raw, quant="q4_0")
    emb = 512 * 128
    assert cost.params_lm_head == emb and cost.lm_head_bytes == emb * 4  # reads the embedding
    assert cost.bytes_of("lm_head") == 0
    from arkinfer.quant.recipe import get_preset

    qhead = ModelCost.from_config(raw, quant=get_preset("q4_0", skip=()))
    assert qhead.bytes_of("lm_head") == emb // 32 * 18 == qhead.lm_head_bytes
    assert qhead.params == cost.params


def test_headers_give_the_same_sizes_as_the_file(tiny_checkpoint):
    from arkinfer.frontend.checkpoint import open_checkpoint

    folder = tiny_checkpoint("minicpm")
    ckpt = open_checkpoint(folder, with_tokenizer=False)
    by_headers = ModelCost.from_config(ckpt.raw_config, "f32", ckpt.weights.infos)
    by_config = ModelCost.from_config(ckpt.raw_config, "f32")
    assert by_headers.weight_bytes == ckpt.weights.total_bytes() == by_config.weight_bytes
    assert by_headers.params_active == by_config.params_active


def test_refused_shapes_stay_float():
    raw = tiny_config("llama", intermediate_size=200, torch_dtype="bfloat16")
    cost = ModelCost.from_config(raw, quant="q4_0")
    kept = {t.name for t in cost.float_layers()}
    assert kept == {"lm_head.weight", "model.layers.0.mlp.down_proj.weight",
                    "model.layers.1.mlp.down_proj.weight"}
    down = next(t for t in cost.tensors if t.name == "model.layers.0.mlp.down_proj.weight")
    assert down.storage.nbytes == 128 * 200 * 2


def test_errors_name_the_problem(marlin):
    dense_only = ModelCost.from_config(KNOWN_CONFIGS["minicpm4.1-8b-dense"], quant="f16")
    with pytest.raises(ConfigError, match="no sparse_config"):
        predict(dense_only, load_target("jetson-orin"), attention="sparse")
    with pytest.raises(TargetError, match="arkinfer doctor"):
        predict(marlin, load_target("host"))
    with pytest.raises(ConfigError, match="unknown quant scheme 'int3'"):
        ModelCost.from_config(RAW, quant="int3")
    with pytest.raises(TargetError, match="not allowed for backend 'gguf'"):
        make_plan("minicpm4.1-8b", "rpi5", "marlin")


def test_no_compute_peak_predicts_decode_only(marlin):
    android = load_target("android")
    p = predict(marlin, android, ctx=4096, prompt=512)
    assert p.prefill is None and p.ttft_s is None and p.decode.t_compute is None
    assert p.decode_tok_s == pytest.approx(0.7 * 76.8e9 / p.decode.bytes)
