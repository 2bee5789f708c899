"""Bad input to the coreml backend: coremltools missing, an IR op without a conversion, a
quant format or option it cannot take — each one error naming the thing and the next step."""

from __future__ import annotations

import sys

import pytest
import torch

from arkinfer import ir
from arkinfer.errors import ArkError, NotAvailableError, TargetError
from arkinfer.models.configs import tiny_config
from arkinfer.pipeline.plan import resolve_plan


def test_coremltools_missing_is_one_error_with_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "coremltools", None)  # import coremltools -> ImportError
    with pytest.raises(NotAvailableError) as exc:
        resolve_plan("demo", target="iphone-15-pro", backend="coreml", quant="f16",
                     out=tmp_path / "a")
    assert "'coreml' is not installed" in exc.value.message
    assert "pip install 'arkinfer[coreml]'" in exc.value.hint


pytest.importorskip("coremltools")

from arkinfer.backends.coreml.backend import BACKEND  # noqa: E402
from arkinfer.backends.coreml.preflight import raise_unconverted  # noqa: E402
from arkinfer.backends.coreml.program import unconverted_ops  # noqa: E402


def test_an_op_without_a_conversion_is_named_at_plan_time():
    raw = tiny_config("llama", num_hidden_layers=1)
    program = ir.trace(raw, dtype=torch.float32, shape_only=True, entries=("prefill",))
    assert unconverted_ops(program) == {}
    folded = ir.run_passes(program, ["fold_rope_tables"])  # rope -> rope_table (not converted)
    with pytest.raises(TargetError) as exc:
        raise_unconverted(unconverted_ops(folded))
    assert "rope_table" in exc.value.message and "prefill:%" in exc.value.message


def test_use_nope_is_refused_by_preflight():
    raw = tiny_config("minicpm", num_hidden_layers=1,
                      sparse_config={"use_nope": True, "dense_len": 128, "window_size": 64,
                                     "topk": 2})
    with pytest.raises(TargetError, match="use_nope"):
        BACKEND.preflight(raw, None, None, "f16")


def test_formats_without_an_exact_layout_are_refused(tmp_path):
    with pytest.raises(TargetError) as exc:
        resolve_plan("demo", target="iphone-15-pro", backend="coreml", quant="mlx4",
                     out=tmp_path / "b")
    assert "mlx" in exc.value.message


def test_int4_on_the_iphone_resolves_to_a_coreml_preset():
    from arkinfer.frontend.checkpoint import read_config, resolve_model_path
    from arkinfer.resolve import resolve
    from arkinfer.targets import load_target

    r = resolve("int4", read_config(resolve_model_path("demo")), load_target("iphone-15-pro"),
                "coreml")
    assert r.backend == "coreml" and r.recipe.format == "gptq" and r.recipe.bits == 4


def test_bad_options_name_the_option(tmp_path):
    from arkinfer.backend import LowerRequest
    from arkinfer.backends.coreml.artifact import options_of

    def request(**options):
        return LowerRequest(tmp_path, tmp_path, None, "f16", None, tmp_path,
                            options={k: str(v) for k, v in options.items()})

    assert options_of(request(), 4096) == (4096, "fp16", "none")
    for bad, word in (({"context": 100}, "multiple of 64"), ({"compute": "int8"}, "compute"),
                      ({"compress": "zip"}, "compress"), ({"threads": 2}, "unknown")):
        with pytest.raises(ArkError, match=word):
            options_of(request(**bad), 4096)
