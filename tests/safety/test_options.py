"""`--option KEY=VALUE` (issue 37, item 9): every backend declares its keys (`Backend.options`),
and one check (`arkinfer.backend.check_backend_options`) refuses an unknown, empty or malformed
key and a value outside the declared choices at plan time, before any work, naming the backend's
keys; every hint's example is itself a valid option of that backend.
"""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from arkinfer.backend import BackendOption, backend_names, check_backend_options, get_backend
from arkinfer.cli.main import app
from arkinfer.errors import ArkError
from arkinfer.pipeline.plan import resolve_plan

runner = CliRunner()
EXAMPLE = re.compile(r"e\.g\. --option (\S+)$")


def example_of(hint: str) -> str:
    """The `KEY=VALUE` a hint offers as its example."""
    found = EXAMPLE.search(hint)
    assert found, hint
    return found.group(1)


@pytest.mark.parametrize("item,needle", [
    ("bogus=1", "unknown gguf option(s) ['bogus']"),
    ("=x", "has an empty KEY"),
    (" =x", "has an empty KEY"),
    ("embedings=f16", "did you mean 'embeddings'?"),
    ("EMBEDDINGS=f16", "did you mean 'embeddings'?"),
    ("noequals", "--option 'noequals' is not KEY=VALUE"),
    ("embeddings=zz", "--option embeddings='zz' is not a gguf choice"),
    ("rtn=", "--option rtn='' is not a gguf choice"),
])
def test_bad_options_fail_at_plan_time_with_the_keys(tmp_path, item, needle):
    """Each used to build and exit 0 (or fail only in lower); now the CLI exits 1 before any
    work with one error naming the bad key and a hint listing the backend's keys."""
    out = tmp_path / "a"
    result = runner.invoke(app, ["build", "demo", "--target", "host", "--quant", "f32",
                                 "--option", item, "-o", str(out)])
    text = result.output
    assert result.exit_code == 1, text
    assert sum(line.startswith("error:") for line in text.splitlines()) == 1, text
    assert needle in text and "Traceback" not in text and "this is a bug" not in text, text
    hint = next(line for line in text.splitlines() if line.startswith("hint:"))
    assert "embeddings=" in hint and "rtn=ggml|folder" in hint, hint
    assert "mix=" not in hint  # the old hint's example was no gguf option
    assert not out.exists()
    check_backend_options(get_backend("gguf"), [example_of(hint)])  # the example is valid


@pytest.mark.parametrize("name", backend_names())
def test_every_backend_hint_example_is_one_of_its_options(name):
    """An unknown key's hint offers `--option KEY=VALUE` that the same check accepts."""
    backend = get_backend(name)
    assert all(isinstance(k, str) and k and isinstance(v, BackendOption)
               for k, v in backend.options.items())
    with pytest.raises(ArkError) as exc:
        check_backend_options(backend, {"no_such_option": "1"})
    assert "no_such_option" in exc.value.message
    if not backend.options:
        assert "takes no --option" in exc.value.hint
        return
    for key in backend.options:
        assert key in exc.value.hint
    assert check_backend_options(backend, [example_of(exc.value.hint)])


@pytest.mark.parametrize("name", backend_names())
def test_every_declared_choice_passes_the_check(name):
    backend = get_backend(name)
    for key, spec in backend.options.items():
        for value in spec.choices or (spec.example_value(),):
            assert check_backend_options(backend, {key: value}) == {key: value}


def test_api_callers_pass_a_mapping_and_the_plan_keeps_it(tmp_path):
    plan = resolve_plan("demo", target="host", quant="q4_0", out=tmp_path / "a",
                        options={"embeddings": "f16"})
    assert plan.options == {"embeddings": "f16"}
    with pytest.raises(ArkError, match=r"unknown gguf option\(s\) \['colour'\]"):
        resolve_plan("demo", target="host", quant="q4_0", out=tmp_path / "b",
                     options={"colour": "blue"})
    assert not (tmp_path / "b").exists()


def test_a_backend_without_options_refuses_any():
    with pytest.raises(ArkError) as exc:
        check_backend_options(get_backend("reference"), ["x=1"])
    assert "it takes none" in exc.value.message and "drop it" in exc.value.hint


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "1e400", "x", ""])
def test_mlx_shard_mb_must_be_a_positive_finite_number(value):
    """`shard_mb=nan` or `inf` reached `int(mb * 2**20)` in lower: ValueError / OverflowError,
    reported as a bug; now refused at plan time."""
    with pytest.raises(ArkError, match="shard_mb"):
        check_backend_options(get_backend("mlx"), {"shard_mb": value})


def test_coreml_context_is_checked_at_plan_time():
    backend = get_backend("coreml")
    assert check_backend_options(backend, {"context": "2048"}) == {"context": "2048"}
    for bad in ("100", "x", "-64", "0"):
        with pytest.raises(ArkError, match="context"):
            check_backend_options(backend, {"context": bad})


def test_declared_choices_are_what_the_lowerings_read():
    """The lowering's tables agree with the declarations (a fact lives with the backend)."""
    from arkinfer.backends.gguf.plan import EMBED_CHOICES

    assert tuple(EMBED_CHOICES) == get_backend("gguf").options["embeddings"].choices
    mlx = pytest.importorskip("arkinfer.backends.mlx.tensors")
    assert tuple(mlx.SCALE_OPTIONS) == get_backend("mlx").options["scales"].choices
    tvm = pytest.importorskip("arkinfer.backends.tvm.artifact")
    assert tuple(tvm.FLOAT_WEIGHTS) == get_backend("tvm").options["float_weights"].choices
