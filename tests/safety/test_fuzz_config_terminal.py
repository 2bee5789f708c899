"""Property-based fuzzing for issue #37's config values and terminal safety.

- int-vs-float config values: any JSON number (an int of any size, a float, NaN/inf, a bool) in
  any range-checked key either loads as a value of the declared type inside its range, or is
  one ConfigError; never OverflowError, never a value outside the range.
- escape sequences in every manifest field: a control sequence put into any text field of an
  artifact's manifest never reaches the terminal raw from `bench` (markdown and CSV) or
  `verify`, whether the command succeeds or refuses the manifest.

Derandomized with bounded examples, so CI runs the same cases every time, in well under a minute.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from arkinfer.cli.main import app
from arkinfer.errors import ConfigError
from arkinfer.models import parse_config
from arkinfer.models.config_values import FLOAT_LIMITS, INT_LIMITS
from arkinfer.models.configs import tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()
FAST = settings(max_examples=300, deadline=None, derandomize=True, database=None)

def slow(examples: int):
    """Settings for examples that run a command on an artifact (bench ~0.3 s, verify ~3 s)."""
    return settings(max_examples=examples, deadline=timedelta(seconds=60), derandomize=True,
                    database=None, suppress_health_check=[HealthCheck.too_slow,
                                                          HealthCheck.function_scoped_fixture])

# -------------------------------------------------------------------- int-vs-float config values
# Keys ConfigReader reads with a type and a range, and the config that carries them.
FLOAT_KEYS = {"rms_norm_eps": "llama", "rope_theta": "llama", "scale_emb": "minicpm",
              "scale_depth": "minicpm"}
INT_KEYS = {"hidden_size": "llama", "num_hidden_layers": "llama", "vocab_size": "llama",
            "max_position_embeddings": "llama", "intermediate_size": "llama",
            "dim_model_base": "minicpm"}
NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.sampled_from([0, -1, 1, 10**30, 10**400, -(10**400), 2**1023, 2**1024, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)


@FAST
@given(key=st.sampled_from(sorted(FLOAT_KEYS) + sorted(INT_KEYS)), value=NUMBERS)
def test_config_numbers_load_in_range_or_fail_cleanly(key, value):
    model_type = FLOAT_KEYS.get(key) or INT_KEYS[key]
    try:
        config = parse_config(tiny_config(model_type, **{key: value}))
    except ConfigError as exc:
        assert key in exc.message
        assert len(exc.message) < 2000  # a 401-digit value is abbreviated
        return
    loaded = getattr(config, key)
    if key in FLOAT_KEYS:
        low, high = FLOAT_LIMITS[key]
        assert type(loaded) is float and low < loaded <= high
        assert not isinstance(value, bool) and low < value <= high  # the value as written
    else:
        low_i, high_i = INT_LIMITS[key]
        assert type(loaded) is int and low_i <= loaded <= high_i
        assert not isinstance(value, bool) and isinstance(value, int)


# ------------------------------------------------------- escape sequences in manifest fields
ACTIVE = "\x1b\x9b\x07\x08\r\x00\x7f\u202e\u2028"  # characters a terminal acts on
HOSTILE = st.lists(st.sampled_from(["\x1b[2J", "\x1b]0;title\x07", "\x9b31m", "\r", "\n",
                                    "\nFAKE: passed", "\r\nFAKE", "\t", "\x08", "\x00",
                                    "\x7f", "\u202e", "\u2028", "[red]x[/]", "|", "é", "a"]),
                   min_size=1, max_size=6).map("".join)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz-terminal") / "art"
    res = runner.invoke(app, ["build", "demo", "--target", "host", "--quant", "f32", "-o",
                              str(out)])
    assert res.exit_code == 0, res.output
    return out


def _text_fields(manifest: dict) -> list[tuple]:
    """Paths of every string value of the manifest (the per-file hash table left out)."""
    found: list[tuple] = []

    def walk(value, path: tuple) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, (*path, key))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, (*path, i))
        elif isinstance(value, str):
            found.append(path)

    walk({k: v for k, v in manifest.items() if k not in ("files", "prediction")}, ())
    return [p for p in found if p[:2] != ("source", "files")]


def _with_field(artifact: Path, folder: Path, path: tuple, text: str) -> Path:
    copy = folder / "art"
    shutil.copytree(artifact, copy)
    manifest = json.loads((copy / "arkinfer.json").read_text())
    holder = manifest
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = holder[path[-1]] + text if path[-1] != "path" else text
    (copy / "arkinfer.json").write_text(json.dumps(manifest))
    return copy


def _assert_inert(out: str) -> None:
    for char in ACTIVE:
        assert char not in out, (repr(char), out)
    assert not any(line.startswith("FAKE") for line in out.splitlines()), out
    if "error:" in out:
        assert out.count("error:") == 1 and "this is a bug" not in out, out


@pytest.mark.parametrize("command,examples", [
    (["bench", "-p", "4", "-n", "2", "-r", "1", "--warmup", "0"], 20),
    (["bench", "-p", "4", "-n", "0", "-r", "1", "--warmup", "0", "-f", "csv"], 10),
    (["verify"], 6),
], ids=["bench-md", "bench-csv", "verify"])
def test_escape_sequences_in_any_manifest_field_stay_inert(artifact, command, examples):
    fields = _text_fields(json.loads((artifact / "arkinfer.json").read_text()))

    @slow(examples)
    @given(path=st.sampled_from(fields), text=HOSTILE)
    def check(path, text):
        with tempfile.TemporaryDirectory() as tmp:
            copy = _with_field(artifact, Path(tmp), path, text)
            res = runner.invoke(app, [command[0], str(copy), *command[1:]])
            _assert_inert(res.output)

    check()
