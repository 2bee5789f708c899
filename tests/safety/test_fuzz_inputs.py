"""Property-based fuzzing of every input parser (issue #20): safetensors headers, GGUF files,
config.json, and tokenizer files with chat templates built from dangerous constructs.

Each example starts from a valid file (the tiny test checkpoint, a tiny GGUF, the demo model),
mutates it, and runs the real entry points — `arkinfer inspect` through CliRunner and the library
loaders — in a forked child whose address space is capped (RLIMIT_AS: what it already maps plus
MEMORY) and which is killed after TIMEOUT seconds. The properties: the command succeeds, or it
prints exactly one `error:` line and a `hint:`, never a traceback nor "this is a bug"; the
loaders return or raise an `ArkError`, nothing else; no example runs out of memory or time.
Examples are derandomized, so CI runs the same ones every time.
"""

from __future__ import annotations

import json
import os
import resource
import select
import shutil
import signal
import struct
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from arkinfer.cli.main import app
from arkinfer.errors import ArkError
from arkinfer.frontend.demo import demo_model_path
from arkinfer.testing.synthetic import write_checkpoint
from arkinfer.models.configs import tiny_config

MEMORY = 2 << 30  # bytes a child may map beyond what it maps at fork time
TIMEOUT = 20.0  # seconds per example (the chat-template render limit is 5 s)
FUZZ = settings(max_examples=50, deadline=timedelta(seconds=30), derandomize=True,
                database=None, suppress_health_check=[HealthCheck.too_slow])


# -- running one example in a bounded child --------------------------------------------------------

def _vm_size() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("VmSize:"))) * 1024


def run_bounded(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """fn() in a forked child under RLIMIT_AS and TIMEOUT; its dict result (JSON) or a failure."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            os.close(read_end)
            limit = _vm_size() + MEMORY
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            payload = {"ok": True, **fn()}
        except BaseException:  # noqa: BLE001 - reported to the parent
            payload = {"ok": False, "crash": traceback.format_exc()}
        with os.fdopen(write_end, "w") as fh:
            fh.write(json.dumps(payload))
        os._exit(0)
    os.close(write_end)
    if not select.select([read_end], [], [], TIMEOUT)[0]:  # the child writes once, at its end
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_end)
        pytest.fail(f"example took longer than {TIMEOUT} s")
    chunks = []
    while chunk := os.read(read_end, 1 << 16):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    text = b"".join(chunks).decode()
    assert text, f"the child died without a result (status {status}; out of memory?)"
    result = json.loads(text)
    assert result["ok"], result.get("crash")
    return result


def cli_inspect(path: Path) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["inspect", str(path)])
    return {"exit_code": result.exit_code, "output": result.output}


def library(fn: Callable[[], Any]) -> str:
    """'ok', or the ArkError's class name; any other exception propagates (a crash)."""
    try:
        fn()
    except ArkError as exc:
        return type(exc).__name__
    return "ok"


def assert_clean(result: dict[str, Any]) -> None:
    """The CLI either succeeded or printed one error: line plus hint:, and nothing bug-shaped."""
    out = result["output"]
    assert result["exit_code"] in (0, 1), out
    assert "Traceback" not in out and "this is a bug" not in out, out
    if result["exit_code"] == 1:
        assert sum(line.startswith("error:") for line in out.splitlines()) == 1, out
        assert any(line.startswith("hint:") for line in out.splitlines()), out
    assert result.get("library", "ok") == "ok" or result["library"].endswith("Error"), result


# -- shared strategies -----------------------------------------------------------------------------

SPECIAL_INTS = [0, 1, -1, 2, 3, 7, 64, 2**16, 2**31 - 1, 2**31, 2**32, 2**53, 2**62, 2**63,
                2**64 - 1, 10**6, 10**9, -(2**63)]
json_scalars = (st.none() | st.booleans() | st.sampled_from(SPECIAL_INTS)
                | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
                | st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(st.text(max_size=8), children, max_size=4),
                           max_leaves=8)


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz-bases")
    llama = write_checkpoint(root / "llama", tiny_config("llama", vocab_size=256,
                                                          hidden_size=64, intermediate_size=128))
    demo = root / "demo"
    shutil.copytree(demo_model_path(), demo,
                    ignore=shutil.ignore_patterns("__init__.py", "__pycache__"))
    made = {"llama": llama, "demo": demo}
    try:
        from arkinfer.testing.gguf_synthetic import write_tiny_gguf

        write_tiny_gguf(root / "tiny.gguf", "llama")
        made["gguf"] = root / "tiny.gguf"
    except ImportError:  # the gguf extra is part of the dev install CI uses
        pass
    return made


def scratch_copy(base: Path) -> Path:
    work = Path(tempfile.mkdtemp(prefix="arkfuzz-"))
    shutil.copytree(base, work / "model")
    return work / "model"


# -- 1. safetensors headers ------------------------------------------------------------------------

def _split(raw: bytes) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


header_edits = st.one_of(
    st.tuples(st.just("field"), st.sampled_from(["dtype", "shape", "data_offsets", "extra"]),
              st.one_of(json_values, st.lists(st.sampled_from(SPECIAL_INTS), max_size=4),
                        st.sampled_from(["F32", "BF16", "I16", "I8", "U8", "F64", "X"]))),
    st.tuples(st.just("drop_field"), st.sampled_from(["dtype", "shape", "data_offsets"]),
              st.none()),
    st.tuples(st.just("entry"), st.none(), json_values),
    st.tuples(st.just("metadata"), st.none(), json_values),
    st.tuples(st.just("header"), st.none(), json_values),
    st.tuples(st.just("raw"), st.none(), st.sampled_from([b"[" * 5000 + b"]" * 5000,
                                                          b"{" * 3000, b"\xff\xfe", b"", b"{}"])),
    st.tuples(st.just("length"), st.none(), st.sampled_from(SPECIAL_INTS[:16])),
    st.tuples(st.just("data"), st.none(), st.integers(-64, 64)),
)


@FUZZ
@given(edits=st.lists(header_edits, min_size=1, max_size=3), pick=st.integers(0, 100))
def test_fuzz_safetensors_header(bases, edits, pick):
    folder = scratch_copy(bases["llama"])
    try:
        file = folder / "model.safetensors"
        header, data = _split(file.read_bytes())
        raw, length = None, None
        for kind, key, value in edits:
            names = [n for n in header if n != "__metadata__"] if isinstance(header, dict) else []
            name = names[pick % len(names)] if names else "x"
            if kind == "field" and isinstance(header, dict) and isinstance(header.get(name), dict):
                header[name][key] = value
            elif kind == "drop_field" and isinstance(header, dict) and isinstance(
                    header.get(name), dict):
                header[name].pop(key, None)
            elif kind == "entry" and isinstance(header, dict):
                header[name] = value
            elif kind == "metadata" and isinstance(header, dict):
                header["__metadata__"] = value
            elif kind == "header":
                header = value
            elif kind == "raw":
                raw = value
            elif kind == "length":
                length = value
            elif kind == "data":
                data = data[:value] if value < 0 else data + b"\0" * value
        body = raw if raw is not None else json.dumps(header).encode()
        body += b" " * (-len(body) % 8)
        prefix = struct.pack("<Q", (length if length is not None else len(body)) % 2**64)
        file.write_bytes(prefix + body + data)

        def check() -> dict[str, Any]:
            from arkinfer.frontend.checkpoint import load_model, open_checkpoint

            result = cli_inspect(folder)
            result["library"] = library(lambda: load_model(open_checkpoint(folder)))
            return result

        assert_clean(run_bounded(check))
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)


# -- 2. GGUF files ---------------------------------------------------------------------------------

gguf_edits = st.one_of(
    st.tuples(st.just("bytes"), st.integers(0, 7743), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("u64"), st.integers(0, 7736), st.sampled_from(SPECIAL_INTS)),
    st.tuples(st.just("u32"), st.integers(0, 7740),
              st.sampled_from([v % 2**32 for v in SPECIAL_INTS])),
    st.tuples(st.just("field"), st.sampled_from([b"llama.block_count", b"llama.embedding_length",
                                                 b"llama.attention.head_count",
                                                 b"llama.context_length",
                                                 b"llama.feed_forward_length"]),
              st.sampled_from([v % 2**32 for v in SPECIAL_INTS])),
    st.tuples(st.just("count"), st.sampled_from([8, 16]), st.sampled_from(SPECIAL_INTS)),
    st.tuples(st.just("truncate"), st.integers(0, 467_000), st.none()),
)


@FUZZ
@given(edits=st.lists(gguf_edits, min_size=1, max_size=3))
def test_fuzz_gguf_reader(bases, edits):
    if "gguf" not in bases:
        pytest.fail("the gguf package is needed: pip install -e '.[dev,gguf]'")
    work = Path(tempfile.mkdtemp(prefix="arkfuzz-"))
    try:
        data = bytearray(bases["gguf"].read_bytes())
        def pack(fmt: str, offset: int, value: int) -> None:
            if offset + struct.calcsize(fmt) <= len(data):  # an earlier edit may have truncated
                struct.pack_into(fmt, data, offset, value % 2 ** (8 * struct.calcsize(fmt)))

        for kind, where, value in edits:
            if kind == "bytes":
                data[where:where + len(value)] = value
            elif kind in ("u64", "count"):
                pack("<Q", where, value)
            elif kind == "u32":
                pack("<I", where, value)
            elif kind == "field" and where in data:
                pack("<I", data.index(where) + len(where) + 4, value)
            elif kind == "truncate":
                del data[where:]
        path = work / "fuzz.gguf"
        path.write_bytes(bytes(data))

        def check() -> dict[str, Any]:
            from arkinfer.frontend.gguf_import import import_gguf

            os.environ["ARKINFER_CACHE"] = str(work / "cache")
            result = cli_inspect(path)
            result["library"] = library(lambda: import_gguf(path, work / "out"))
            return result

        assert_clean(run_bounded(check))
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- 3. config.json --------------------------------------------------------------------------------

CONFIG_KEYS = ["model_type", "vocab_size", "hidden_size", "intermediate_size",
               "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "rms_norm_eps", "rope_theta", "max_position_embeddings", "tie_word_embeddings",
               "rope_scaling", "sliding_window", "use_sliding_window", "bos_token_id",
               "eos_token_id", "pad_token_id", "hidden_act", "torch_dtype", "scale_emb",
               "scale_depth", "dim_model_base", "sparse_config", "attention_bias",
               "quantization_config", "architectures"]
rope_scalings = st.fixed_dictionaries(
    {"rope_type": st.sampled_from(["default", "linear", "llama3", "longrope", "yarn", 3, None])},
    optional={"factor": json_scalars, "low_freq_factor": json_scalars,
              "high_freq_factor": json_scalars, "original_max_position_embeddings": json_scalars,
              "long_factor": st.lists(json_scalars, max_size=20),
              "short_factor": st.lists(json_scalars, max_size=20)})
config_edits = st.tuples(st.sampled_from(CONFIG_KEYS + ["unknown_key"]),
                         st.one_of(json_values, st.sampled_from(SPECIAL_INTS), rope_scalings))


@FUZZ
@given(base=st.sampled_from(["llama", "demo"]),
       edits=st.lists(config_edits, min_size=1, max_size=3), whole=st.none() | json_values)
def test_fuzz_config(bases, base, edits, whole):
    folder = scratch_copy(bases[base])
    try:
        config = json.loads((folder / "config.json").read_text())
        for key, value in edits:
            config[key] = value
        if isinstance(whole, (list, str, int)):  # a config that is not an object at all
            config = whole
        (folder / "config.json").write_text(json.dumps(config))

        def check() -> dict[str, Any]:
            from arkinfer.frontend.checkpoint import open_checkpoint

            result = cli_inspect(folder)
            result["library"] = library(lambda: open_checkpoint(folder))
            return result

        assert_clean(run_bounded(check))
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)


# -- 4. tokenizer files and chat templates ---------------------------------------------------------

SIZES = st.sampled_from([0, 1, 7, 1000, 10**5, 10**6, 10**9, 2**62])
template_pieces = st.one_of(
    SIZES.map(lambda n: f"{{{{ 'A' * {n} }}}}"),
    SIZES.map(lambda n: f"{{% for i in range({n}) %}}x{{% endfor %}}"),
    SIZES.map(lambda n: f"{{{{ messages|tojson(indent={n}) }}}}"),
    SIZES.map(lambda n: f"{{{{ 'x'.center({n}) }}}}"),
    SIZES.map(lambda n: f"{{{{ 'x\\ny'|indent({n}) }}}}"),
    SIZES.map(lambda n: f"{{{{ 9 ** {n} }}}}"),
    SIZES.map(lambda n: f"{{{{ '%{n}d' % 1 }}}}"),
    SIZES.map(lambda n: f"{{{{ '{{:>{n}}}'.format(1) }}}}"),
    SIZES.map(lambda n: f"{{{{ ('ab' * 1000)|replace('a', 'x' * {n}) }}}}"),
    SIZES.map(lambda n: f"{{{{ (['abc' * 1000] * {n})|join('--') }}}}"),
    st.tuples(st.integers(1, 64), st.sampled_from(["ns.s ~ ns.s", "ns.s + ns.s",
                                                   "[ns.s, ns.s]"])).map(
        lambda a: f"{{% set ns = namespace(s='AB') %}}{{% for i in range({a[0]}) %}}"
                  f"{{% set ns.s = {a[1]} %}}{{% endfor %}}{{{{ ns.s }}}}"),
    st.tuples(SIZES, SIZES).map(lambda ab: f"{{% for i in range({ab[0]}) %}}{{% for j in range("
                                           f"{ab[1]}) %}}{{{{ i }}}}{{% endfor %}}{{% endfor %}}"),
    st.sampled_from([
        "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
        "{{ raise_exception('refused') }}", "{{ undefined_name.attr }}", "{% if %}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}", "{{ messages[0]['content'] }}",
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
        "{% set x %}{% for i in range(100000) %}{{ 'A' * 100000 }}{% endfor %}{% endset %}",
        "{{ lipsum(1000000) }}", "{{ range(10)|list * 1000000 }}", "{{ bos_token ~ eos_token }}",
    ]),
    st.text(max_size=30),
)
tokenizer_edits = st.one_of(
    st.tuples(st.just("template"), st.lists(template_pieces, min_size=1, max_size=4).map("".join)),
    st.tuples(st.just("jinja"), st.lists(template_pieces, min_size=1, max_size=3).map("".join)),
    st.tuples(st.just("jinja_bytes"), st.binary(max_size=64)),
    st.tuples(st.sampled_from(["chat_template", "eos_token", "bos_token"]), json_values),
    st.tuples(st.just("generation_config"), json_values),
    st.tuples(st.just("generation_eos"), st.one_of(json_values, st.sampled_from(SPECIAL_INTS))),
)


@FUZZ
@given(edits=st.lists(tokenizer_edits, min_size=1, max_size=3))
def test_fuzz_tokenizer_and_chat_template(bases, edits):
    folder = scratch_copy(bases["demo"])
    try:
        tok_cfg_path = folder / "tokenizer_config.json"
        tok_cfg = json.loads(tok_cfg_path.read_text())
        for kind, value in edits:
            if kind == "template":
                tok_cfg["chat_template"] = value
            elif kind == "jinja":
                tok_cfg.pop("chat_template", None)
                (folder / "chat_template.jinja").write_text(value)
            elif kind == "jinja_bytes":
                tok_cfg.pop("chat_template", None)
                (folder / "chat_template.jinja").write_bytes(value)
            elif kind == "generation_config":
                (folder / "generation_config.json").write_text(json.dumps(value))
            elif kind == "generation_eos":
                (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": value}))
            else:
                tok_cfg[kind] = value
        tok_cfg_path.write_text(json.dumps(tok_cfg))

        def check() -> dict[str, Any]:
            from arkinfer.frontend.checkpoint import open_checkpoint

            def render() -> None:
                tok = open_checkpoint(folder).tokenizer
                if tok is not None and tok.chat_template:
                    tok.encode_chat([{"role": "user", "content": "hi"}])

            result = cli_inspect(folder)
            result["library"] = library(render)
            return result

        assert_clean(run_bounded(check))
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)
