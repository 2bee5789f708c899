"""What a backend can do is declared once (`Backend.capabilities`, issue #39) and everything
that asks "can backend X do Y" asks it: the shipped target profiles only narrow it, resolve and
plan follow it, gguf's InfLLM v2 follows the probe of its optional runtime, doctor lists the
packages and runtimes the backends declare."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from arkinfer.backend import (ATTENTION_MODES, FLOAT_DTYPES, BackendBase, Capabilities,
                              backend_names, get_backend)
from arkinfer.errors import ArkError, NotAvailableError, TargetError
from arkinfer.latency.plan import make_plan
from arkinfer.latency.source import KNOWN_CONFIGS
from arkinfer.quant.formats import all_formats, get_format
from arkinfer.quant.recipe import PRESETS
from arkinfer.resolve import FLOAT_SCHEMES, resolve, takes
from arkinfer.targets import list_targets, load_target

REGISTERED_FORMATS = {f.name for f in all_formats()}
# MiniCPM4.1-8B: every row a multiple of 256, so no preset's format falls back on its shapes
MINICPM = KNOWN_CONFIGS["minicpm4.1-8b"]


def caps(name: str) -> Capabilities:
    return get_backend(name).capabilities


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
        Capabilities(formats=("gptq",), attention=("sparse",))
    with pytest.raises(ArkError, match="lacks 'dense'"):
        Capabilities(formats=("gptq",), attention=("infllmv2",))
    with pytest.raises(ArkError, match=r"dtypes=\('fp16',\)"):
        Capabilities(formats=("gptq",), dtypes=("fp16",))


def test_onnx_loader_and_declaration_agree():
    """The ONNX weights loader keeps its own list of the formats it reads: it must be the one
    the onnx backend declares (until the loader asks the declaration itself)."""
    pytest.importorskip("onnx")
    from arkinfer.backends.onnx.weights import FUNCTION_FORMATS

    assert set(FUNCTION_FORMATS) == set(caps("onnx").formats) == set(caps("tensorrt").formats)


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
