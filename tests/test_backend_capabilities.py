"""What a backend can do is declared once (`Backend.capabilities`, issue #39) and everything
that asks "can backend X do Y" asks it: the shipped target profiles only narrow it, resolve and
plan follow it, build refuses a program using an IR op the backend does not declare, gguf's
InfLLM v2 follows the probe of its optional runtime, doctor lists the packages and runtimes the
backends declare."""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest
import torch

from arkinfer import ir
from arkinfer.backend import (ATTENTION_MODES, FLOAT_DTYPES, BackendBase, Capabilities,
                              LowerRequest, backend_names, get_backend)
from arkinfer.errors import ArkError, NotAvailableError, TargetError
from arkinfer.latency.plan import make_plan
from arkinfer.latency.source import KNOWN_CONFIGS
from arkinfer.lowering.program import program_of
from arkinfer.lowering.program_ops import check_program_ops, undeclared_ops
from arkinfer.models.configs import tiny_config
from arkinfer.quant.formats import all_formats, get_format
from arkinfer.quant.recipe import PRESETS
from arkinfer.resolve import FLOAT_SCHEMES, resolve, takes
from arkinfer.targets import list_targets, load_target

REGISTERED_FORMATS = {f.name for f in all_formats()}
IR_OPS = {op.value for op in ir.Op}
E2E_DIR = Path(__file__).parent / "backends" / "e2e"  # holds the numpy test backend
# MiniCPM4.1-8B: every row a multiple of 256, so no preset's format falls back on its shapes
MINICPM = KNOWN_CONFIGS["minicpm4.1-8b"]


def caps(name: str) -> Capabilities:
    return get_backend(name).capabilities


def backend_for(name: str):
    """A registered backend, or "numpy": the e2e suite's test backend, which joins from outside
    (tests/backends/e2e/numpy_backend; registered by an entry point only there)."""
    if name != "numpy":
        return get_backend(name)
    sys.path.insert(0, str(E2E_DIR))
    try:
        return importlib.import_module("numpy_backend.backend").BACKEND
    finally:
        sys.path.remove(str(E2E_DIR))


def profile_problems(target) -> list[str]:
    """Every `[backends.X]` entry of `target` that lists what backend X does not declare."""
    problems = []
    for name, support in target.backends.items():
        if name not in backend_names():
            problems.append(f"{target.id}: backend {name!r} is not registered")
            continue
        declared = caps(name)
        problems += [f"{target.id}: [backends.{name}] quant_formats lists {fmt!r}; {name} "
                     f"declares {', '.join(declared.formats)}"
                     for fmt in support.quant_formats if fmt not in declared.formats]
        problems += [f"{target.id}: [backends.{name}] dtypes lists {d}; {name} declares "
                     f"{', '.join(declared.dtypes)}"
                     for d in map(str, support.dtypes) if d in FLOAT_DTYPES
                     and d not in declared.dtypes]
    return problems


# --- the declarations -------------------------------------------------------------------------


@pytest.mark.parametrize("name", backend_names())
def test_every_registered_backend_declares_capabilities(name):
    backend = get_backend(name)
    c = backend.capabilities
    assert isinstance(c, Capabilities)
    assert c.formats and set(c.formats) <= REGISTERED_FORMATS, c.formats
    assert len(set(c.formats)) == len(c.formats)
    for fmt in c.formats:  # a declared width is one each declared format stores
        assert not c.bits or set(c.bits) & set(get_format(fmt).constraints.bits), (fmt, c.bits)
    if c.act_order:  # some declared format must carry a g_idx
        assert any(get_format(f).constraints.act_order for f in c.formats)
    assert set(c.dtypes) <= set(FLOAT_DTYPES) and set(c.attention) <= set(ATTENTION_MODES)
    assert c.ops and set(c.ops) <= IR_OPS, set(c.ops) - IR_OPS
    if c.extra is not None:
        assert f"arkinfer[{c.extra}]" in backend.install_hint()
    # remote bench and the runtime build are declared where the backend implements them
    assert c.remote_bench == (type(backend).bench_remote is not BackendBase.bench_remote)
    assert (c.runtime is not None) == (type(backend).build_runtime
                                       is not BackendBase.build_runtime)


def test_a_backend_without_capabilities_breaks_the_contract():
    class Undeclared(BackendBase):
        name = "undeclared"

    assert not hasattr(Undeclared(), "capabilities")
    with pytest.raises(ArkError, match=r"attention=\('sparse',\)"):
        Capabilities(formats=("gptq",), ops=("linear",), attention=("sparse",))
    with pytest.raises(ArkError, match="lacks 'dense'"):
        Capabilities(formats=("gptq",), ops=("linear",), attention=("infllmv2",))
    with pytest.raises(ArkError, match=r"dtypes=\('fp16',\)"):
        Capabilities(formats=("gptq",), ops=("linear",), dtypes=("fp16",))
    for ops in ((), ("linear", "linear")):
        with pytest.raises(ArkError, match=r"Capabilities.ops=.*empty or repeated"):
            Capabilities(formats=("gptq",), ops=ops)


def test_onnx_loader_and_declaration_agree():
    """The ONNX weights loader keeps its own list of the formats it reads: it must be the one
    the onnx backend declares (until the loader asks the declaration itself)."""
    pytest.importorskip("onnx")
    from arkinfer.backends.onnx.weights import FUNCTION_FORMATS

    assert set(FUNCTION_FORMATS) == set(caps("onnx").formats) == set(caps("tensorrt").formats)


# --- the IR op table ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def traced():
    """{model: Program}: the demo (MiniCPM with InfLLM v2) and a 2-layer tiny Llama, traced as
    build traces them (shape-only, fp32, no passes)."""
    return {model: ir.trace(source, dtype=torch.float32, shape_only=True)
            for model, source in (("demo", "demo"),
                                  ("tiny-llama", tiny_config("llama", num_hidden_layers=2)))}


@pytest.mark.parametrize("name", [*backend_names(), "numpy"])
def test_declared_ops_cover_the_traced_demo_and_tiny_llama(name, traced):
    """What build checks (`check_program_ops` after the backend's ir_passes) passes for every
    backend on both models; a backend that lowers from the weights covers the plain trace."""
    backend = backend_for(name)
    passes = backend.ir_passes if backend.lowers_from_ir else ()
    for model, program in traced.items():
        lowered = ir.run_passes(program, passes)
        assert undeclared_ops(lowered, backend.capabilities.ops) == {}, (name, model)
        check_program_ops(lowered, name, backend.capabilities.ops)


@pytest.mark.parametrize("name,module,table", [
    ("coreml", "arkinfer.backends.coreml.program", "CONVERSIONS"),
    ("tvm", "arkinfer.backends.tvm.lower_relax", "LOWERINGS")])
def test_op_tables_are_what_the_backends_declare(name, module, table):
    """The lowerings that emit from an op table (Core ML's conversions, TVM's Relax emitters)
    take exactly the declared ops: their preflights check the table, build the declaration."""
    if not get_backend(name).available():
        pytest.skip(f"{name}: toolchain not installed ({get_backend(name).install_hint()})")
    ops = getattr(importlib.import_module(module), table)
    assert {str(op) for op in ops} == set(caps(name).ops)


def test_a_program_with_an_undeclared_op_is_refused_naming_it(traced):
    folded = ir.run_passes(traced["tiny-llama"], ["fold_rope_tables"])  # rope -> rope_table
    missing = undeclared_ops(folded, caps("onnx").ops)
    assert list(missing) == ["rope_table"] and len(missing["rope_table"]) == 8  # q, k x 2 x 2
    assert missing["rope_table"][0] == "prefill:%rope (model.layers.0.self_attn)"
    with pytest.raises(TargetError) as err:
        check_program_ops(folded, "onnx", caps("onnx").ops)
    assert err.value.message.startswith("IR op(s) rope_table have no onnx lowering (rope_table "
                                        "at 8 node(s): prefill:%rope (model.layers.0.self_attn)")
    assert "rope, attention" in err.value.hint and "Capabilities.ops" in err.value.hint


def test_build_refuses_an_undeclared_op_before_quantising(monkeypatch, tmp_path):
    """The one call site, build's trace stage: the reference backend with `silu` taken out of
    its declaration fails there, naming the op and its layers, and leaves nothing behind."""
    from arkinfer.pipeline import build as build_module
    from arkinfer.pipeline.plan import resolve_plan

    plan = resolve_plan("demo", target="host", backend="reference", quant="f32",
                        out=tmp_path / "art")
    reference = get_backend("reference")
    without = tuple(op for op in reference.capabilities.ops if op != "silu")
    monkeypatch.setattr(reference, "capabilities", replace(reference.capabilities, ops=without))
    stages: list[str] = []

    class Stages(build_module.Reporter):
        def stage(self, name: str) -> None:
            stages.append(name)

    with pytest.raises(TargetError, match=r"IR op\(s\) silu have no reference lowering .*"
                                          r"\(model.layers.0.mlp\)"):
        build_module.build(plan, reporter=Stages())
    assert stages == ["load", "trace"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_program_of_traces_only_when_the_request_has_no_program(traced, tmp_path):
    """Shared by onnx, coreml and tvm: build's program as handed over, else the model traced
    now the same way (shape-only, fp32) for the entries asked, through the passes given."""
    request = LowerRequest(tmp_path, tmp_path, None, "f32", None, tmp_path,
                           program=traced["demo"])
    assert program_of(request, "demo") is traced["demo"]
    request.program = None
    program = program_of(request, tiny_config("llama", num_hidden_layers=1),
                         passes=("fold_rope_tables",), entries=("prefill",))
    assert list(program.entries) == ["prefill"]
    assert "rope_table" in {str(n.op) for n in program.entry("prefill").nodes}


# --- target profiles only narrow --------------------------------------------------------------


def test_shipped_profiles_list_only_what_their_backends_declare():
    problems = [p for t in list_targets() for p in profile_problems(t)]
    assert not problems, "\n".join(problems)


def test_a_profile_listing_an_undeclared_format_is_caught_and_not_used(tmp_path):
    text = (resources.files("arkinfer.target_profiles") / "host.toml").read_text("utf-8")
    old = '[backends.onnx]\nquant_formats = ["gptq", "awq", "marlin"]'
    assert old in text
    path = tmp_path / "wide.toml"
    path.write_text(text.replace('id = "host"', 'id = "wide-host"').replace(
        old, '[backends.onnx]\nquant_formats = ["gptq", "awq", "marlin", "gguf-q4_0"]'))
    wide = load_target(str(path))
    assert profile_problems(wide) == ["wide-host: [backends.onnx] quant_formats lists "
                                      "'gguf-q4_0'; onnx declares marlin, gptq, awq"]
    assert not takes(wide, "onnx", "q4_0") and takes(wide, "gguf", "q4_0")
    with pytest.raises(TargetError, match="backend 'onnx' cannot run gguf-q4_0.*declares "
                                          "marlin, gptq, awq") as err:
        resolve("q4_0", MINICPM, wide, backend="onnx")
    assert "gptq, awq, marlin" in err.value.hint
    assert resolve("q4_0", MINICPM, wide).backend == "gguf"  # the default backend takes it


def test_tensorrt_profiles_no_longer_offer_onnx_qdq():
    """onnx-qdq was listed for tensorrt on five Jetson / RTX profiles, and its preflight
    (the onnx lowering's) refuses it."""
    from arkinfer.quant.recipe import QuantRecipe

    orin = load_target("jetson-orin")
    assert "onnx-qdq" not in orin.backend("tensorrt").quant_formats
    with pytest.raises(TargetError, match="onnx-qdq"):
        get_backend("tensorrt").preflight(MINICPM, QuantRecipe("rtn", "onnx-qdq", 4, 128), None)


# --- resolve and plan ask the declarations ----------------------------------------------------


@pytest.mark.parametrize("tid", sorted(t.id for t in list_targets()))
def test_resolve_takes_exactly_what_profile_and_backend_both_allow(tid):
    target = load_target(tid)
    for name, support in target.backends.items():
        c = caps(name)
        for scheme in (*FLOAT_SCHEMES, *PRESETS):
            if scheme in FLOAT_SCHEMES:
                expected = scheme in map(str, support.dtypes) and scheme in c.dtypes
            else:
                fmt = PRESETS[scheme].format
                expected = fmt in support.quant_formats and fmt in c.formats
            assert takes(target, name, scheme) == expected, (name, scheme)
            if not expected:
                with pytest.raises(TargetError):
                    resolve(scheme, MINICPM, target, backend=name)
                continue
            r = resolve(scheme, MINICPM, target, backend=name)
            assert r.backend == name
            assert r.recipe is None or r.recipe.format in c.formats
    r = resolve("int4", MINICPM, target)
    assert r.recipe.format in caps(r.backend).formats and r.recipe.bits == 4


@pytest.fixture
def llamacpp_cache(tmp_path, monkeypatch):
    """An empty $ARKINFER_CACHE (no InfLLM v2 llama.cpp built) and the gguf runner's choice
    left to the build: returns a function that leaves a finished build's stamp there, as
    `arkinfer doctor --build-llamacpp` does (llamacpp_build.py: lib/ with libllama.so and
    arkinfer-build.json), without building llama.cpp."""
    from arkinfer.backends.gguf import llamacpp_build as build

    monkeypatch.setenv("ARKINFER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ARKINFER_LLAMACPP", raising=False)

    def finish_build() -> None:
        lib = build.build_root() / "lib"
        lib.mkdir(parents=True)
        (lib / "libllama.so").write_bytes(b"")
        (lib / build.STAMP).write_text(json.dumps({
            "patches": build.patch_set_hash(), "version": build.PINNED_VERSION,
            "cmake_flags": build.CMAKE_FLAGS}))

    return finish_build


def _attention_rows(plan) -> set[str]:
    return {p.attention for p in plan.rows}


def test_plan_on_rpi5_is_dense_until_the_infllmv2_llamacpp_is_built(llamacpp_cache, monkeypatch):
    assert not caps("gguf").runs_infllmv2()
    plan = make_plan("minicpm4.1-8b", "rpi5", "int4")
    assert plan.backend == "gguf" and plan.sparse_supported is False
    assert _attention_rows(plan) == {"dense"}
    att = dict(plan.ops())["attention"]
    assert "InfLLM v2 not on gguf" in att and "arkinfer doctor --build-llamacpp" in att

    llamacpp_cache()
    assert caps("gguf").runs_infllmv2()
    plan = make_plan("minicpm4.1-8b", "rpi5", "int4")
    assert plan.sparse_supported is True and _attention_rows(plan) == {"dense", "sparse"}
    assert "InfLLM v2 from 8192 tokens" in dict(plan.ops())["attention"]

    monkeypatch.setenv("ARKINFER_LLAMACPP", "upstream")  # the runner would load upstream
    assert make_plan("minicpm4.1-8b", "rpi5", "int4").sparse_supported is False


def test_backends_without_an_optional_runtime_plan_sparse_rows(llamacpp_cache):
    plan = make_plan("minicpm4.1-8b", "jetson-orin", "int4")
    assert plan.backend == "tensorrt" and caps("tensorrt").runtime is None
    assert plan.sparse_supported is True and _attention_rows(plan) == {"dense", "sparse"}


# --- doctor lists what the backends declare ---------------------------------------------------


def test_doctor_packages_come_from_the_declarations():
    from arkinfer.cli import doctor

    used_for = doctor.packages()
    declared = {d for n in backend_names() for d in caps(n).packages}
    assert declared <= set(used_for)
    # the same distributions doctor listed before the declarations held them
    assert set(used_for) == {"torch", "numpy", "safetensors", "tokenizers", "onnx", "onnxruntime",
                             "gguf", "llama-cpp-python", "mlx", "apache-tvm", "coremltools",
                             "transformers", "matplotlib"}
    assert used_for["gguf"] == "gguf backend writer, GGUF import ([gguf])"
    assert used_for["onnx"] == "onnx, tensorrt backends graph ([onnx])"
    assert used_for["coremltools"] == "coreml backend ([coreml])"


def test_doctor_finds_the_runtime_by_its_declared_flag():
    from arkinfer.cli import doctor

    backend, runtime = doctor.runtime_backend("llamacpp")
    assert backend.name == "gguf" and runtime.title == "InfLLM v2 llama.cpp"
    with pytest.raises(NotAvailableError, match="--build-tensorrt") as err:
        doctor.runtime_backend("tensorrt")
    assert "--build-llamacpp (gguf)" in err.value.hint
