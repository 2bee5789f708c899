"""Property test: `arkinfer verify` on a real artifact whose arkinfer.json is mutated at random
(issue #20). Whatever the manifest holds — other JSON shapes, wrong types, `../` and absolute
paths, huge numbers, NaN, broken or deeply nested JSON — verify either passes (a harmless
mutation) or exits 1 with one `error:` and one `hint:` line: no traceback, no "this is a bug".

The CLI runs in one worker subprocess under an address-space limit (RLIMIT_AS), so a mutation
that makes ArkInfer allocate without bound fails the test instead of the machine; every
request has a time limit. 50 derandomised examples.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arkinfer.frontend.demo import demo_model_path

MEMORY_LIMIT = 3 << 30  # the worker needs ~0.8 GiB of address space for a verify of the demo
REQUEST_SECONDS = 60

# Reads JSON argument lists from stdin, runs the CLI on each, answers one JSON line per request.
WORKER = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
import torch
torch.set_num_threads(1)
from typer.testing import CliRunner
from arkinfer.cli.main import app
runner = CliRunner()
for line in sys.stdin:
    res = runner.invoke(app, json.loads(line))
    exc = res.exception
    unexpected = None if exc is None or isinstance(exc, SystemExit) else repr(exc)
    print(json.dumps({"code": res.exit_code, "output": res.output, "unexpected": unexpected}),
          flush=True)
"""

HOSTILE_PATHS = ["/etc/passwd", "../../../../etc/passwd", "model/../../outside", "", ".", "model",
                 "model/", "model/\x00x", "C:\\Windows\\win.ini", "\\\\server\\share", "~/x",
                 "x" * 5000, "model/config.json/..", "arkinfer.json"]
WORDS = ["gguf", "tensorrt", "reference", "f32", "bf16", "q4_0", "ternary", "rtn", "gptq", "1"]
RAW = [b"", b"{", b"[]", b"null", b"NaN", b"1" * 5000, b"[" * 100_000 + b"]" * 100_000,
       b'{"schema_version": 1}', b'{"schema_version": 1e999}', b"\xff\xfe{}",
       b" " * (65 << 20)]  # larger than any manifest

leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                 st.sampled_from(HOSTILE_PATHS + WORDS))
json_value = st.recursive(leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8)


def same_type(value) -> st.SearchStrategy:
    """Another value of `value`'s JSON type: passes the schema's type checks, so the mutation
    reaches the code behind it (hostile strings, huge or negative numbers, NaN)."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([0, -1, 2**63]))
    if isinstance(value, float):
        return st.floats(allow_nan=True, allow_infinity=True)
    if isinstance(value, str):
        return st.one_of(st.sampled_from(HOSTILE_PATHS + WORDS), st.text(max_size=12))
    return json_value


@st.composite
def mutated(draw, original: dict) -> bytes:
    """The manifest's bytes after one random mutation."""
    kind = draw(st.sampled_from(["retype", "retype", "retype", "replace", "replace", "delete",
                                 "add_file", "raw"]))
    if kind == "raw":
        return draw(st.sampled_from(RAW))
    manifest = copy.deepcopy(original)
    if kind == "add_file":
        path = draw(st.one_of(st.sampled_from(HOSTILE_PATHS), st.text(max_size=30)))
        manifest["files"][path] = {"sha256": draw(st.one_of(st.just("0" * 64), json_value)),
                                   "bytes": draw(st.one_of(st.integers(-1, 2**64), json_value))}
    else:  # walk down from the root, then replace or delete what the walk stopped at
        node = manifest
        while True:
            key = draw(st.sampled_from(list(node) if isinstance(node, dict) else range(len(node))))
            child = node[key]
            if isinstance(child, dict | list) and child and draw(st.booleans()):
                node = child
                continue
            break
        if kind == "delete":
            del node[key]
        else:
            node[key] = draw(same_type(child) if kind == "retype" else json_value)
    return json.dumps(manifest).encode()


class Worker:
    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(MEMORY_LIMIT)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     text=True)

    def run(self, *args: str) -> dict:
        import selectors

        self.proc.stdin.write(json.dumps([str(a) for a in args]) + "\n")
        self.proc.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        assert sel.select(REQUEST_SECONDS), f"no answer within {REQUEST_SECONDS} s to {args}"
        line = self.proc.stdout.readline()
        assert line, f"the worker died (rc {self.proc.poll()}) on {args}"
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


@pytest.fixture(scope="module")
def artifact(worker, tmp_path_factory):
    """A float artifact of the demo model without its sparse_config (verify in ~2 s)."""
    root = tmp_path_factory.mktemp("fuzz")
    source = root / "dense-demo"
    shutil.copytree(demo_model_path(), source,
                    ignore=shutil.ignore_patterns("__init__.py", "__pycache__"))
    config = json.loads((source / "config.json").read_text())
    config.pop("sparse_config")
    (source / "config.json").write_text(json.dumps(config))
    out = root / "artifact"
    res = worker.run("build", source, "--target", "host", "--backend", "reference", "--quant",
                     "f32", "-o", out)
    assert res["code"] == 0, res["output"]
    return out


def _lines_starting(output: str, prefix: str) -> int:
    return sum(line.startswith(prefix) for line in output.splitlines())


@settings(max_examples=50, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_verify_survives_any_manifest(worker, artifact, data):
    path = artifact / "arkinfer.json"
    original = path.read_bytes()
    text = data.draw(mutated(json.loads(original)))
    try:
        path.write_bytes(text)
        res = worker.run("verify", artifact)
    finally:
        path.write_bytes(original)
    out = res["output"]
    assert res["unexpected"] is None, (res["unexpected"], out)
    assert "Traceback" not in out and "this is a bug" not in out, out
    assert res["code"] in (0, 1), out
    if res["code"] == 1:
        assert _lines_starting(out, "error:") == 1 and _lines_starting(out, "hint:") == 1, out
    else:
        assert "passed" in out, out


def test_the_artifact_verifies_unmutated(worker, artifact):
    res = worker.run("verify", artifact)
    assert res["code"] == 0 and "passed" in res["output"], res["output"]
