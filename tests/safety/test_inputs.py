"""Hostile input files (model folders, safetensors, GGUF, tokenizer, chat template) — issue #20.

Each case reproduces a report from the hostile-input campaign: an input that exhausted the
machine, blocked forever, loaded the wrong thing, or ended in "this is a bug in ArkInfer". Now
every one is refused before anything is allocated, with one `error:` line naming the file, the
key or tensor, the bad value and the limit, plus a `hint:`.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from arkinfer.cli.main import app
from arkinfer.errors import ArkError, CheckpointError, ConfigError, GGUFError, TokenizerError
from arkinfer.frontend.checkpoint import load_model, open_checkpoint
from arkinfer.frontend.demo import demo_model_path
from arkinfer.testing.synthetic import write_checkpoint
from arkinfer.frontend.tokenizer import load_tokenizer
from arkinfer.models.configs import tiny_config
from arkinfer.paths import resolve_inside

runner = CliRunner()


def assert_clean_error(result, *needles: str) -> str:
    """Exit 1 with exactly one `error:` line and a `hint:`, no traceback, no "bug" message."""
    out = result.output
    assert result.exit_code == 1, out
    assert sum(line.startswith("error:") for line in out.splitlines()) == 1, out
    assert "hint:" in out and "Traceback" not in out and "this is a bug" not in out, out
    for needle in needles:
        assert needle in out, out
    return out


def inspect(folder) -> str:
    return runner.invoke(app, ["inspect", str(folder)])


def copy_demo(tmp_path: Path) -> Path:
    folder = tmp_path / "demo"
    shutil.copytree(demo_model_path(), folder,
                    ignore=shutil.ignore_patterns("__init__.py", "__pycache__"))
    return folder


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.fixture
def tiny(tiny_checkpoint, tmp_path) -> Path:
    """A private copy of a tiny one-file llama checkpoint."""
    folder = tmp_path / "tiny"
    shutil.copytree(tiny_checkpoint("llama"), folder)
    return folder


# -- 1. sizes that drive allocation ------------------------------------------------------------

@pytest.mark.parametrize("changes,needles", [
    ({"num_hidden_layers": 1_000_000}, ["'num_hidden_layers' = 1000000", "allowed 1..4096"]),
    ({"hidden_size": 2**62}, ["'hidden_size' = 4611686018427387904", "allowed 1..1048576"]),
    ({"vocab_size": 2**62}, ["'vocab_size'", "allowed 1..16777216"]),
    ({"intermediate_size": 2**62}, ["'intermediate_size'", "allowed 1..4194304"]),
    ({"num_attention_heads": 0}, ["'num_attention_heads' = 0", "allowed 1..4096"]),
    ({"num_hidden_layers": 0}, ["'num_hidden_layers' = 0"]),
    ({"model_type": ["llama"]}, ["model_type ['llama'] is not supported"]),
    ({"rms_norm_eps": float("nan")}, ["'rms_norm_eps' must be a finite number, got nan"]),
    ({"rope_theta": float("inf")}, ["'rope_theta' must be a finite number, got inf"]),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, ["'rope_scaling.factor' = 0"]),
    ({"rope_scaling": {"rope_type": "linear"}}, ["lacks 'factor'"]),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4,
                       "high_freq_factor": 4, "original_max_position_embeddings": 8192}},
     ["'rope_scaling.high_freq_factor' (4) must be greater"]),
    ({"rope_scaling": {"type": ["linear"]}}, ["'rope_scaling.rope_type' must be a string"]),
    ({"eos_token_id": 100_000}, ["'eos_token_id' = 100000 is beyond the vocabulary",
                                 "allowed 0..511"]),
    ({"eos_token_id": ["x"]}, ["'eos_token_id' must be a token id"]),
    ({"torch_dtype": "nn"}, ["'torch_dtype' = 'nn' is not supported"]),
])
def test_bad_config_values_are_config_errors(tiny, changes, needles):
    edit_json(tiny / "config.json", **changes)  # json writes NaN / Infinity, as HF files can
    with pytest.raises(ConfigError):
        open_checkpoint(tiny)
    assert_clean_error(inspect(tiny), "config.json", *needles)


@pytest.mark.parametrize("changes,needle", [
    ({"dim_model_base": 0}, "'dim_model_base' = 0"),
    ({"scale_depth": float("nan")}, "'scale_depth' must be a finite number"),
    ({"rope_scaling": {"rope_type": "longrope", "long_factor": ["x"], "short_factor": [1.0]}},
     "'rope_scaling.long_factor' must be a list of positive finite numbers"),
    ({"sparse_config": {"kernel_size": 0}}, "'kernel_size' must be positive"),
])
def test_bad_minicpm_config_values(tmp_path, changes, needle):
    folder = copy_demo(tmp_path)
    edit_json(folder / "config.json", **changes)
    assert_clean_error(inspect(folder), needle)


def test_config_claiming_more_layers_than_the_weights_is_refused_before_building(tiny):
    edit_json(tiny / "config.json", num_hidden_layers=4000)
    start = time.monotonic()
    result = runner.invoke(app, ["run", str(tiny), "-p", "hi", "-n", "1", "--raw"])
    assert_clean_error(result, "declares num_hidden_layers=4000",
                       "weights hold layers 0..1 (2 distinct)")
    assert time.monotonic() - start < 30


def test_config_embedding_size_must_match_the_weights(tiny):
    edit_json(tiny / "config.json", vocab_size=100_000)
    assert_clean_error(inspect(tiny), "vocab_size x hidden_size = [100000, 128]",
                       "model.embed_tokens.weight is [512, 128]")


def test_memory_is_checked_before_the_model_is_loaded(tiny, monkeypatch):
    import psutil

    class Tiny:
        available = 1 << 20

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Tiny())
    with pytest.raises(CheckpointError, match=r"needs 0\.00 GiB .* has 0\.00 GiB available"):
        load_model(open_checkpoint(tiny, with_tokenizer=False))


# -- GGUF header counts and block_count ---------------------------------------------------------

def _gguf(tmp_path: Path, name: str = "tiny.gguf") -> Path:
    pytest.importorskip("gguf")
    from arkinfer.testing.gguf_synthetic import write_tiny_gguf

    path = tmp_path / name
    write_tiny_gguf(path, "llama")
    return path


def _patch(path: Path, after: bytes, offset: int, fmt: str, value: int) -> None:
    """Overwrite the `fmt` value `offset` bytes after the first occurrence of `after`."""
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, data.index(after) + len(after) + offset, value)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("after,offset,fmt,value,needle", [
    (b"llama.block_count", 4, "<I", 10**7,
     "metadata 'llama.block_count' = 10000000 is out of range; allowed 1..4096"),
    (b"llama.block_count", 4, "<I", 3,
     "metadata 'llama.block_count' = 3 but the file's tensors hold blocks 0..1"),
    (b"llama.embedding_length", 4, "<I", 2**31, "metadata 'llama.embedding_length'"),
    (b"GGUF", 4, "<Q", 2**62, "tensor count 4611686018427387904 does not fit in the file"),
    (b"GGUF", 12, "<Q", 2**62, "metadata key count 4611686018427387904 does not fit"),
    (b"tokenizer.ggml.token_type", 8, "<Q", 2**62, "array length 4611686018427387904"),
    (b"tokenizer.ggml.tokens", 8, "<Q", 10**6, "array length 1000000 does not fit"),
    (b"general.architecture", 4, "<Q", 2**40, "string length 1099511627776 does not fit"),
])
def test_gguf_counts_are_checked_before_allocating(tmp_path, monkeypatch, after, offset, fmt,
                                                   value, needle):
    from arkinfer.frontend import gguf_model
    from arkinfer.frontend.gguf_reader import GGUFFile

    path = _gguf(tmp_path)
    _patch(path, after, offset, fmt, value)
    start = time.monotonic()
    with pytest.raises(GGUFError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        f = GGUFFile(path)
        gguf_model.plan_tensors(f, gguf_model.ARCHS["llama"])
    assert time.monotonic() - start < 10
    monkeypatch.setenv("ARKINFER_CACHE", str(tmp_path / "cache"))
    assert_clean_error(inspect(path), needle)


# -- 2. chat templates: bounded output, memory and time -----------------------------------------

HOSTILE_TEMPLATES = {
    "repeat": ("{{ 'A' * 400000000 }}", "repetition x 400000000 would be over 4,000,000"),
    "tojson-indent": ("{{ messages|tojson(indent=100000000) }}", "integer argument 100000000"),
    "nested-range": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                     "{% endfor %}", "more than 2,000,000 loop iterations"),
    "doubling-concat": ("{% set ns = namespace(s='A') %}{% for i in range(40) %}"
                        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
                        "'~' concatenation would be over"),
    "doubling-plus": ("{% set ns = namespace(s='A') %}{% for i in range(40) %}"
                      "{% set ns.s = ns.s + ns.s %}{% endfor %}", "a sum would be over"),
    "shared-list": ("{% set ns = namespace(l=['A']) %}{% for i in range(60) %}"
                    "{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}",
                    "an output value would be over"),
    "width": ("{{ '%1000000000d' % 1 }}", "format width"),
    "center": ("{{ 'x'.center(1000000000) }}", "integer argument 1000000000"),
    "replace": ("{{ ('A' * 1000000).replace('A', 'BBBBBBBBBB') }}", "str.replace()"),
    "join": ("{{ ('A' * 1000000).join(['x'] * 1000) }}", "str.join()"),
    "power": ("{{ 10 ** 10000000 }}", "bits, over 4,096"),
    "block": ("{% set x %}{% for i in range(100000) %}{{ 'A' * 3000000 }}{% endfor %}{% endset %}",
              "produced more than 40,000,000 characters"),
    "output": ("{% for i in range(100000) %}" + "A" * 100 + "{% endfor %}",
               "the rendered prompt would be over 4,000,000"),
}


@pytest.fixture(scope="module")
def demo_tokenizer():
    return load_tokenizer(demo_model_path())


@pytest.mark.parametrize("name", sorted(HOSTILE_TEMPLATES))
def test_hostile_chat_templates_hit_a_named_limit(demo_tokenizer, name):
    template, needle = HOSTILE_TEMPLATES[name]
    demo_tokenizer.chat_template = template
    start = time.monotonic()
    with pytest.raises(TokenizerError, match="exceeded a rendering limit") as err:
        demo_tokenizer.render_chat([{"role": "user", "content": "hi"}])
    assert needle in err.value.message
    assert time.monotonic() - start < 10


def test_real_chat_template_renders_unchanged(demo_tokenizer):
    demo_tokenizer.chat_template = (demo_model_path() / "chat_template.jinja").read_text()
    prompt = demo_tokenizer.render_chat([{"role": "user", "content": "hi"}])
    assert prompt == "<s><|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


PARITY_TEMPLATE = r"""
{%- set ns = namespace(found=false, last=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- if not ns.found and message.role == "user" %}{% set ns.found = true %}{% set ns.last =
        (messages|length - 1) - loop.index0 %}{% endif %}
{%- endfor %}
{%- if tools %}<tools>{% for tool in tools %}{{ tool|tojson(indent=4) }}{% if not loop.last
    %},{% endif %}{% endfor %}</tools>{% endif %}
{%- for message in messages %}
{{ loop.index }}/{{ loop.length }} {{ '<|im_start|>' + message.role + '\n' +
    message.content.split('</think>')[-1].lstrip('\n') + '<|im_end|>' ~ '\n' }}
{%- endfor %}
{% macro box(x) %}[{{ caller() }}:{{ x }}]{% endmacro %}{% call box(3) %}inner{% endcall %}
{% filter upper %}last user {{ ns.last }}{% endfilter %}
{% set blk %}{% for i in range(3) %}{{ i }}{% else %}none{% endfor %}{% endset %}{{ blk * 2 }}
{% for item in tree recursive %}{{ item.name }}({{ loop(item.children) }}){% endfor %}
{{ "%s-%d"|format("a", 3) }} {{ '{}!'.format('x') }} {{ 'ab'|replace('a', 'c') }}
{{ [1, 2, 3]|join(',') }} {{ 'x'|center(7) }}|{{ 'a\nb'|indent(2) }} {{ 2 ** 10 }} {{ 'ab' * 3 }}
{{ [1] + [2] }} {{ '%05.1f' % 3.14159 }} {{ {'a': [1, {'b': None}]} }}
{% if add_generation_prompt %}<|im_start|>assistant{% endif %}"""


def test_bounded_sandbox_renders_like_the_plain_sandbox():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from arkinfer.frontend.chat_sandbox import BoundedEnvironment

    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                          extensions=["jinja2.ext.loopcontrols"])
    plain.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False,
                                                                indent=indent)
    variables = dict(
        messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "<think>x</think>\nyo"}],
        tools=[{"name": "f", "parameters": {"a": 1}}], add_generation_prompt=True,
        tree=[{"name": "a", "children": [{"name": "b", "children": []}]}])
    expected = plain.from_string(PARITY_TEMPLATE).render(**variables)
    assert "LAST USER 1" in expected and "a(b())" in expected and '"a": 1' in expected
    assert BoundedEnvironment().render(PARITY_TEMPLATE, **variables) == expected


def test_hostile_chat_template_in_run(tmp_path):
    folder = copy_demo(tmp_path)
    edit_json(folder / "tokenizer_config.json", chat_template="{{ 'A' * 400000000 }}")
    result = runner.invoke(app, ["run", str(folder), "-p", "hi", "-n", "1"])
    assert_clean_error(result, "exceeded a rendering limit", "--raw")


# -- 3. only regular files are opened -------------------------------------------------------------

@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json",
                                  "tokenizer_config.json", "generation_config.json",
                                  "chat_template.jinja"])
def test_a_fifo_in_the_model_folder_is_refused_not_read(tmp_path, name):
    folder = tmp_path / "m"
    write_checkpoint(folder, tiny_config("llama"))
    demo = demo_model_path()
    for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(demo / extra, folder / extra)
    edit_json(folder / "tokenizer_config.json", chat_template=None)
    (folder / name).unlink(missing_ok=True)
    os.mkfifo(folder / name)
    # A subprocess: before the fix opening the FIFO blocked forever.
    proc = subprocess.run([sys.executable, "-m", "arkinfer.cli.main", "inspect", str(folder)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert f"{name} is a FIFO (named pipe), not a regular file" in proc.stderr
    assert "Traceback" not in proc.stderr and "this is a bug" not in proc.stderr


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "generation_config.json"])
def test_a_directory_named_like_a_model_file_is_refused(tiny, name):
    (tiny / name).unlink(missing_ok=True)
    (tiny / name).mkdir()
    assert_clean_error(inspect(tiny), f"{name} is a directory, not a regular file")


def test_gguf_fifo_is_refused(tmp_path):
    pytest.importorskip("gguf")
    from arkinfer.frontend.gguf_reader import GGUFFile

    os.mkfifo(tmp_path / "x.gguf")
    with pytest.raises(GGUFError, match="is a FIFO"):
        GGUFFile(tmp_path / "x.gguf")


# -- 4. safetensors headers with the wrong JSON shapes ------------------------------------------

def write_safetensors(path: Path, header, data: bytes = b"") -> None:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def F32(shape, offsets):
    return {"dtype": "F32", "shape": shape, "data_offsets": offsets}


@pytest.mark.parametrize("header,data,needle", [
    ([1, 2], b"", "must be a JSON object, found list"),
    ({"w": {"dtype": "F32", "shape": [1]}}, b"\0" * 4, "tensor 'w'"),
    ({"w": F32(4, [0, 16])}, b"\0" * 16, "shape must be a list of non-negative integers, got 4"),
    ({"w": F32("4", [0, 16])}, b"\0" * 16, "got '4'"),
    ({"w": F32([True], [0, 4])}, b"\0" * 4, "got [True]"),
    ({"w": F32([1], [0, 4, 8])}, b"\0" * 8, "data_offsets must be [begin, end]"),
    ({"w": F32([1], [-4, 0])}, b"\0" * 4, "got [-4, 0]"),
    ({"w": F32([1], [8, 4])}, b"\0" * 8, "got [8, 4]"),
    ({"w": "x"}, b"", "header entry must be an object"),
    ({"a": F32([1], [0, 4]), "b": F32([1], [0, 4])}, b"\0" * 4, "overlaps the previous tensor"),
    ({"a": F32([1], [4, 8])}, b"\0" * 8, "leaves a gap before it"),
    ({"a": F32([1], [0, 4])}, b"\0" * 8, "has 4 bytes after its last tensor"),
    ({"a": F32([2**62, 2**62], [0, 4])}, b"\0" * 4, "declares shape"),
    ({"__metadata__": {"x": 1}, "a": F32([1], [0, 4])}, b"\0" * 4, "'__metadata__'"),
    (b"[" * 100_000 + b"]" * 100_000, b"", "nested too deeply"),
])
def test_malformed_safetensors_headers(tiny, header, data, needle):
    file = tiny / "model.safetensors"
    write_safetensors(file, header, data)
    with pytest.raises(CheckpointError) as err:
        open_checkpoint(tiny)
    assert needle in err.value.message and str(file) in err.value.message
    assert_clean_error(inspect(tiny), needle)


def test_absurd_header_length(tiny):
    file = tiny / "model.safetensors"
    file.write_bytes(struct.pack("<Q", 2**63) + b"{}" + b" " * 6)
    assert_clean_error(inspect(tiny), "header length 9223372036854775808 exceeds")


# -- 5. dtype must match the tensor kind ---------------------------------------------------------

def rewrite_header(file: Path, edit) -> None:
    raw = file.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header)
    write_safetensors(file, header, raw[8 + n:])


def test_float_tensor_relabelled_as_integer_is_refused(tmp_path):
    folder = write_checkpoint(tmp_path / "bf16", tiny_config("llama"), dtype=torch.bfloat16)
    rewrite_header(folder / "model.safetensors",
                   lambda h: h["model.norm.weight"].update(dtype="I16"))
    ckpt = open_checkpoint(folder, with_tokenizer=False)  # sizes still agree
    with pytest.raises(CheckpointError, match=r"wrong dtype \(1\): model\.norm\.weight: checkpoint "
                       r"I16, model expects a float dtype \(F32/F16/BF16/F64\)"):
        load_model(ckpt)
    result = runner.invoke(app, ["run", str(folder), "-p", "hi", "-n", "1", "--raw"])
    assert result.exit_code == 1 and "this is a bug" not in result.output


# -- 6. index paths stay inside the model folder ---------------------------------------------------

@pytest.fixture
def sharded(tiny_checkpoint, tmp_path) -> Path:
    folder = tmp_path / "inside" / "model"
    shutil.copytree(tiny_checkpoint("llama", shard_bytes=400_000), folder)
    return folder


def _redirect(folder: Path, target: str) -> None:
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["model.norm.weight"] = target
    index.write_text(json.dumps(data))


@pytest.mark.parametrize("how,needle", [("dotdot", "contains '..'"), ("absolute", "is absolute"),
                                        ("symlink", "outside")])
def test_index_entries_outside_the_folder_are_refused(sharded, how, needle):
    shard = sharded / json.loads((sharded / "model.safetensors.index.json").read_text())[
        "weight_map"]["model.norm.weight"]
    outside = sharded.parent / "outside.safetensors"
    shutil.copy(shard, outside)
    if how == "dotdot":
        _redirect(sharded, "../outside.safetensors")
    elif how == "absolute":
        _redirect(sharded, str(outside))
    else:
        (sharded / "link.safetensors").symlink_to(outside)
        _redirect(sharded, "link.safetensors")
    with pytest.raises(ArkError, match=needle):
        open_checkpoint(sharded)
    assert_clean_error(inspect(sharded), "weight_map entry 'model.norm.weight'", needle)


def test_resolve_inside(tmp_path):
    (tmp_path / "a").mkdir()
    assert resolve_inside(tmp_path, "a/b.txt", "x") == (tmp_path / "a" / "b.txt").resolve()
    for bad in ("../x", "/etc/passwd", "a/../../x", "C:\\x", "", "a\0b"):
        with pytest.raises(ArkError, match="'what'"):
            resolve_inside(tmp_path, bad, "'what'")


# -- 8. tokenizer files ----------------------------------------------------------------------------

@pytest.mark.parametrize("file,content,error,needle", [
    ("tokenizer_config.json", {"chat_template": ["a", 1]}, TokenizerError,
     "'chat_template' as a list must hold"),
    ("tokenizer_config.json", {"chat_template": {"x": 1}}, TokenizerError,
     "'chat_template' must be a string, got dict"),
    ("tokenizer_config.json", {"eos_token": ["<|im_end|>"]}, TokenizerError,
     "'eos_token' must be a string"),
    ("tokenizer_config.json", {"bos_token": {"content": 5}}, TokenizerError, "'bos_token'"),
    ("generation_config.json", [1, 2], ConfigError, "must hold a JSON object, found list"),
    ("generation_config.json", {"eos_token_id": 99_999}, ConfigError,
     "'eos_token_id' = 99999 is beyond the vocabulary; allowed 0..2047"),
    ("config.json", {"eos_token_id": [2, 5000]}, ConfigError, "'eos_token_id' = 5000 is beyond"),
])
def test_bad_tokenizer_files(tmp_path, file, content, error, needle):
    folder = copy_demo(tmp_path)
    if isinstance(content, dict):
        edit_json(folder / file, **content)
    else:
        (folder / file).write_text(json.dumps(content))
    with pytest.raises(error) as err:
        open_checkpoint(folder)
    assert needle in err.value.message
    assert_clean_error(inspect(folder), needle)


def test_non_utf8_chat_template_file(tmp_path):
    folder = copy_demo(tmp_path)
    edit_json(folder / "tokenizer_config.json", chat_template=None)
    (folder / "chat_template.jinja").write_bytes(b"{{ messages }}\xff\xfe")
    assert_clean_error(inspect(folder), "chat_template.jinja", "UTF-8")


# -- 9. the GGUF import cache is keyed on content --------------------------------------------------

def test_gguf_cache_notices_an_edit_with_the_mtime_restored(tmp_path, monkeypatch):
    from arkinfer.frontend.checkpoint import resolve_model_path

    monkeypatch.setenv("ARKINFER_CACHE", str(tmp_path / "cache"))
    path = _gguf(tmp_path)
    first = resolve_model_path(str(path))
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # one bit of the last tensor's data
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    second = resolve_model_path(str(path))
    assert second != first  # re-imported, not the stale import
    assert resolve_model_path(str(path)) == second  # and reused while unchanged


# -- 10. weight shards honour the umask ------------------------------------------------------------

@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640)])
def test_saved_shards_honour_the_umask(tmp_path, umask, mode):
    from arkinfer.frontend.shard_writer import save_safetensors

    old = os.umask(umask)
    try:
        save_safetensors({"w": torch.zeros(2)}, tmp_path / "w.safetensors", {"format": "pt"})
        (tmp_path / "other.json").write_text("{}")
    finally:
        os.umask(old)
    assert (tmp_path / "w.safetensors").stat().st_mode & 0o777 == mode
    assert (tmp_path / "other.json").stat().st_mode & 0o777 == mode


def test_quantised_export_shards_honour_the_umask(tiny_checkpoint, tmp_path):
    from arkinfer.quant import QuantRecipe
    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.calib_data import calibration_from_ids
    from arkinfer.quant.export import export_folder

    ids = calibration_from_ids(torch.randint(0, 512, (2, 16), generator=torch.Generator()
                                             .manual_seed(0)))
    old = os.umask(0o022)
    try:
        run = calibrate(tiny_checkpoint("llama"), QuantRecipe("rtn", "gptq", 4, 64), ids,
                        tmp_path / "work")
        out = export_folder(run, tmp_path / "out")
    finally:
        os.umask(old)
    modes = {f.name: f.stat().st_mode & 0o777 for f in out.iterdir()}
    assert any(name.endswith(".safetensors") for name in modes)
    assert set(modes.values()) == {0o644}, modes
