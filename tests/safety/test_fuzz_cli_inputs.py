"""Hostile command lines against every command (issue 37): device files, a FIFO, a folder and a
missing path as every path argument, and huge, negative and non-finite numbers for every numeric
option.

The property, for every case: the command exits 1 or 2 with exactly one `error:` line and a
`hint:` — no traceback, no "this is a bug in ArkInfer" — inside a time and memory cap. Each case
runs `arkinfer` through typer's CliRunner in a forked child (`run_bounded` of the parser fuzz
suite: RLIMIT_AS of its mapping at fork plus 2 GiB, killed after 20 s), so an unbounded read
(`/dev/zero`), a blocking open (a FIFO) or a huge allocation fails the case, not the machine. The
children fork from one worker process that runs nothing itself: a child forked from pytest after
other tests ran torch in it can hang in its first parallel region (its thread pools did not
survive the fork).

Paths: the set of (argument, kind) pairs is small and finite, so every pair runs (one test id
each: a failure names the command and argument). Device files are fresh `mknod` copies of
/dev/zero, /dev/urandom and /dev/full in a temporary folder (symlinks to them where mknod is not
permitted), so a command that wrongly replaces its output path replaces only the copy. Outputs
(-o, --work-dir, import's OUT_DIR) also get a user's regular file, which must survive.
Numbers: hypothesis draws each option's values (derandomized, two per option, no shrinking
phase so CI time is fixed): integers from 10^9 to 10^40 and from -10^40 to -2, and
`99999999999999999999`, 2^63, 2^64, 10^400, `1e309`, `nan`, `inf`. A size or count must be
refused when huge or negative; a seed, temperature, damping or shard size only when negative;
any value must end cleanly.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

TIMEOUT = 20.0  # seconds per case: test_fuzz_inputs.TIMEOUT, the time cap of run_bounded
BENCH_FAST = ["-p", "8", "-n", "4", "-r", "1", "--warmup", "0"]
DEVICES = {"dev-zero": (1, 5), "dev-urandom": (1, 9), "dev-full": (1, 7)}
DEVICE_PATHS = {"dev-zero": "/dev/zero", "dev-urandom": "/dev/urandom", "dev-full": "/dev/full"}
# /dev/full reads like /dev/zero, and writing to /dev/zero or /dev/urandom succeeds like writing
# to any file, so each role gets the devices that behave differently (CI time)
IN_KINDS = ["dev-zero", "dev-urandom", "fifo", "folder", "missing"]
OUT_KINDS = ["dev-full", "fifo", "user-file"]  # a missing or empty folder is a valid output

# (id, arguments, kinds): {X} is the hostile path, {ART} the module's artifact, {TEXT} a valid
# text file, {GGUF} a valid tiny GGUF, {NEW} a fresh output folder.
PATH_CASES = [
    ("run-MODEL", ["run", "{X}", "-p", "hi", "-n", "2"], IN_KINDS),
    ("eval-MODEL", ["eval", "{X}", "--text", "{TEXT}", "--ctx", "16", "--max-windows", "1"],
     IN_KINDS),
    ("eval--text", ["eval", "demo", "--text", "{X}", "--ctx", "16", "--max-windows", "1"],
     IN_KINDS),
    ("bench-ARTIFACT", ["bench", "{X}", *BENCH_FAST], IN_KINDS),
    ("bench--plot", ["bench", "{ART}", *BENCH_FAST, "--plot", "{X}"], IN_KINDS),
    ("verify-ARTIFACT", ["verify", "{X}"], IN_KINDS),
    ("verify--source", ["verify", "{ART}", "--source", "{X}"], IN_KINDS),
    ("plan-MODEL", ["plan", "{X}", "-t", "host", "-q", "q4_0"], IN_KINDS),
    ("plan--target", ["plan", "demo", "-t", "{X}", "-q", "q4_0"], IN_KINDS),
    ("build-MODEL", ["build", "{X}", "-q", "f32", "-o", "{NEW}"], IN_KINDS),
    ("build--target", ["build", "demo", "-t", "{X}", "-q", "f32", "-o", "{NEW}"], IN_KINDS),
    ("build--calib", ["build", "demo", "-q", "gptq", "--samples", "1", "--seq-len", "8",
                      "--calib", "{X}", "-o", "{NEW}"], IN_KINDS),
    ("build-o", ["build", "demo", "-q", "f32", "-o", "{X}"], OUT_KINDS),
    ("quantize-MODEL", ["quantize", "{X}", "--method", "rtn", "--format", "gptq", "-o", "{NEW}"],
     IN_KINDS),
    ("quantize--calib", ["quantize", "demo", "--method", "gptq", "--samples", "1", "--seq-len",
                         "8", "--calib", "{X}", "-o", "{NEW}"], IN_KINDS),
    ("quantize-o", ["quantize", "demo", "--method", "rtn", "--format", "gptq", "-o", "{X}"],
     OUT_KINDS),
    ("quantize--work-dir", ["quantize", "demo", "--method", "rtn", "--format", "gptq", "-o",
                            "{NEW}", "--work-dir", "{X}"], OUT_KINDS),
    ("import-FILE", ["import", "{X}", "{NEW}"], IN_KINDS),
    ("import-OUT_DIR", ["import", "{GGUF}", "{X}"], OUT_KINDS),
    ("inspect-MODEL", ["inspect", "{X}"], IN_KINDS),
    ("targets-show", ["targets", "show", "{X}"], IN_KINDS),
    ("matrix-MODEL", ["matrix", "{X}", "-t", "host", "-q", "f32", "--list", "-o", "{NEW}"],
     IN_KINDS),
    ("matrix--targets", ["matrix", "demo", "-t", "{X}", "-q", "f32", "--list", "-o", "{NEW}"],
     IN_KINDS),
    ("matrix-o", ["matrix", "demo", "-t", "host", "-q", "f32", "-o", "{X}"], OUT_KINDS),
    ("matrix--merge", ["matrix", "--merge", "{X}", "-o", "{NEW}"], IN_KINDS),
]

# (id, arguments with {N}, class): "size" must refuse huge and negative values; "nonneg" must
# refuse negative ones; every value must end cleanly.
NUMBER_CASES = [
    ("run-n", ["run", "demo", "-p", "hi", "-n", "{N}"], "size"),
    ("run--temperature", ["run", "demo", "-p", "hi", "-n", "2", "--temperature", "{N}"],
     "nonneg"),
    ("run--top-p", ["run", "demo", "-p", "hi", "-n", "2", "--top-p", "{N}"], "size"),
    ("run--seed", ["run", "demo", "-p", "hi", "-n", "2", "--seed", "{N}"], "nonneg"),
    ("eval--ctx", ["eval", "demo", "--text", "{TEXT}", "--ctx", "{N}", "--max-windows", "1"],
     "size"),
    ("eval--max-windows", ["eval", "demo", "--text", "{TEXT}", "--ctx", "16", "--max-windows",
                           "{N}"], "nonneg"),
    ("bench-p", ["bench", "{ART}", "-p", "{N}", "-n", "4", "-r", "1", "--warmup", "0"], "size"),
    ("bench-n", ["bench", "{ART}", "-p", "8", "-n", "{N}", "-r", "1", "--warmup", "0"], "size"),
    ("bench-d", ["bench", "{ART}", *BENCH_FAST, "-d", "{N}"], "size"),
    ("bench-r", ["bench", "{ART}", "-p", "8", "-n", "4", "-r", "{N}", "--warmup", "0"], "size"),
    ("bench--warmup", ["bench", "{ART}", "-p", "8", "-n", "4", "-r", "1", "--warmup", "{N}"],
     "size"),
    ("bench--threads", ["bench", "{ART}", *BENCH_FAST, "--threads", "{N}"], "size"),
    ("build--samples", ["build", "demo", "-q", "gptq", "--samples", "{N}", "--seq-len", "8",
                        "-o", "{NEW}"], "size"),
    ("build--seq-len", ["build", "demo", "-q", "gptq", "--samples", "1", "--seq-len", "{N}",
                        "-o", "{NEW}"], "size"),
    ("quantize--bits", ["quantize", "demo", "--method", "rtn", "--format", "gptq", "--bits",
                        "{N}", "-o", "{NEW}"], "size"),
    ("quantize--group-size", ["quantize", "demo", "--method", "rtn", "--format", "gptq",
                              "--group-size", "{N}", "-o", "{NEW}"], "size"),
    ("quantize--samples", ["quantize", "demo", "--method", "gptq", "--samples", "{N}",
                           "--seq-len", "8", "-o", "{NEW}"], "size"),
    ("quantize--seq-len", ["quantize", "demo", "--method", "gptq", "--samples", "1",
                           "--seq-len", "{N}", "-o", "{NEW}"], "size"),
    ("quantize--seed", ["quantize", "demo", "--method", "gptq", "--samples", "1", "--seq-len",
                        "8", "--seed", "{N}", "-o", "{NEW}"], "nonneg"),
    ("quantize--damp", ["quantize", "demo", "--method", "gptq", "--samples", "1", "--seq-len",
                        "8", "--damp", "{N}", "-o", "{NEW}"], "nonneg"),
    ("plan--context", ["plan", "demo", "-t", "host", "-q", "q4_0", "-c", "{N}"], "size"),
    ("matrix-j", ["matrix", "demo", "-t", "host", "-q", "f32", "--list", "-j", "{N}", "-o",
                  "{NEW}"], "nonneg"),  # more jobs than cells: all cells at once
    ("import--max-shard-size", ["import", "{GGUF}", "{NEW}", "--max-shard-size", "{N}"],
     "nonneg"),
]

numbers = st.one_of(  # the first example is the campaign's 99999999999999999999
    st.sampled_from(["99999999999999999999", str(2**63), str(2**64), "1" + "0" * 400,
                     "1e309", "nan", "inf", "-inf"]),
    st.integers(10**9, 10**40).map(str),
    st.integers(-(10**40), -2).map(str))
NUMBERS = settings(max_examples=2, derandomize=True, database=None, deadline=None,
                   phases=[Phase.explicit, Phase.generate],
                   suppress_health_check=[HealthCheck.too_slow])


# -- the worker and the inputs built once ---------------------------------------------------------

# Reads [seconds, args] JSON lines on stdin; runs each in a child of `run_bounded` (the parser
# fuzz suite's: imported, not copied) under that time cap and answers one JSON line: exit code,
# output, stray exception, or the failure (time cap, crash, death) run_bounded reported.
WORKER = r"""
import json, os, sys, traceback
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # what a library writes to fd 1 in a child cannot garble an answer
sys.path.insert(0, sys.argv[1])
import test_fuzz_inputs as bounded
from typer.testing import CliRunner
from arkinfer.cli.main import app

def invoke(args):
    import torch
    torch.set_num_threads(1)
    res = CliRunner().invoke(app, args)
    exc = res.exception
    stray = None if exc is None or isinstance(exc, SystemExit) else "".join(
        traceback.format_exception(exc))
    return {"exit_code": res.exit_code, "output": res.output, "stray": stray}

for line in sys.stdin:
    bounded.TIMEOUT, args = json.loads(line)
    try:
        answer = bounded.run_bounded(lambda: invoke(args))
    except BaseException as exc:  # pytest.fail (time cap), the child's crash or death
        answer = {"failure": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(answer), file=answers, flush=True)
"""


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> Iterator[Callable[..., dict[str, Any]]]:
    """cli(args) -> {exit_code, output, stray}: `arkinfer args` in a bounded child of the worker
    (`seconds=`: its time cap, run_bounded's 20 s by default); a case over the time or memory cap
    fails with run_bounded's reason."""
    log = tmp_path_factory.mktemp("cli-worker") / "stderr.txt"
    with open(log, "w") as err:
        worker = subprocess.Popen([sys.executable, "-c", WORKER, str(Path(__file__).parent)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                  text=True)

    def run(args: list[str], seconds: float = TIMEOUT) -> dict[str, Any]:
        worker.stdin.write(json.dumps([seconds, args]) + "\n")
        worker.stdin.flush()
        ready = select.select([worker.stdout], [], [], seconds + 60)[0]  # run_bounded stops it
        line = worker.stdout.readline() if ready else ""
        assert line, f"the worker stopped answering: {log.read_text()[-2000:]}"
        answer = json.loads(line)
        if "failure" in answer:
            pytest.fail(f"arkinfer {' '.join(args)}: {answer['failure']}")
        return answer

    yield run
    worker.stdin.close()
    worker.wait(timeout=60)


@pytest.fixture(scope="module")
def inputs(cli, tmp_path_factory) -> dict[str, str]:
    """A float demo artifact, a text file for eval and a tiny GGUF for import."""
    root = tmp_path_factory.mktemp("cli-fuzz")
    art = root / "art"
    built = cli(["build", "demo", "--target", "host", "--quant", "f32", "-o", str(art)],
                seconds=300)  # a build, not a case: no 20 s cap
    assert built["exit_code"] == 0, built["output"]
    text = root / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 20)
    made = {"ART": str(art), "TEXT": str(text), "ROOT": str(root)}
    try:
        from arkinfer.testing.gguf_synthetic import write_tiny_gguf

        write_tiny_gguf(root / "tiny.gguf", "llama")
        made["GGUF"] = str(root / "tiny.gguf")
    except ImportError:  # the gguf extra is part of the dev install CI uses
        pass
    return made


def hostile_path(kind: str) -> Path:
    """A fresh path of `kind` in a new temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix="arkfuzz-cli-"))
    path = folder / kind
    if kind in DEVICES:
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(*DEVICES[kind]))
        except (PermissionError, OSError):
            os.symlink(DEVICE_PATHS[kind], path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "user-file":
        path.write_text("my thesis\n")
    elif kind == "missing":
        path = folder / "missing" / "nothing"  # a missing parent too; no .png for --plot
    return path


def fill(args: list[str], inputs: dict[str, str], **values: str) -> list[str]:
    out = []
    for arg in args:
        for key, value in {**inputs, **values}.items():
            arg = arg.replace("{" + key + "}", value)
        if "{NEW}" in arg:
            arg = arg.replace("{NEW}", str(Path(inputs["ROOT"]) / f"new-{uuid.uuid4().hex}"))
        out.append(arg)
    if any("{GGUF}" in a for a in out):
        pytest.skip("the gguf extra is not installed")
    return out


def check(result: dict[str, Any], args: list[str], *, must_refuse: bool) -> None:
    """The property: a refusal (or, where allowed, success) with one error: and a hint:."""
    out, code = result["output"], result["exit_code"]
    where = f"arkinfer {' '.join(a if len(a) < 60 else a[:60] + '...' for a in args)}\n{out}"
    assert result["stray"] is None, f"{where}\n{result['stray']}"
    assert "Traceback" not in out and "this is a bug" not in out, where
    if code == 0 and not must_refuse:
        return
    assert code in (1, 2), f"exit code {code}: {where}"
    lines = out.splitlines()
    assert sum(line.startswith("error:") for line in lines) == 1, where
    assert any(line.startswith("hint:") for line in lines), where


# -- every path argument ---------------------------------------------------------------------------

@pytest.mark.parametrize("case,kind", [
    pytest.param(name, kind, id=f"{name}[{kind}]")
    for name, _, kinds in PATH_CASES for kind in kinds])
def test_hostile_paths_are_refused(cli, inputs, case, kind):
    template = next(args for name, args, _ in PATH_CASES if name == case)
    path = hostile_path(kind)
    args = fill(template, inputs, X=str(path))
    try:
        check(cli(args), args, must_refuse=True)
        if kind == "user-file":
            assert path.read_text() == "my thesis\n", f"{case} changed the user's file"
        elif kind in DEVICES and not path.is_symlink():
            assert path.is_char_device(), f"{case} replaced the device file {path}"
    finally:
        shutil.rmtree(path.parent if kind != "missing" else path.parent.parent,
                      ignore_errors=True)


# -- every numeric option --------------------------------------------------------------------------

def _magnitude(value: str) -> float:
    try:
        return float(value)
    except (ValueError, OverflowError):
        return math.nan


@pytest.mark.parametrize("case", [name for name, _, _ in NUMBER_CASES])
@NUMBERS
@given(value=numbers)
def test_huge_and_negative_numbers_are_refused(cli, inputs, case, value):
    template, kind = next((args, kind) for name, args, kind in NUMBER_CASES if name == case)
    args = fill(template, inputs, N=value)
    number = _magnitude(value)
    must_refuse = number < 0 or (kind == "size" and number >= 10**9)
    check(cli(args), args, must_refuse=must_refuse)
