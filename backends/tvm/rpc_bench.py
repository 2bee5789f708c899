"""`arkinfer bench ARTIFACT --rpc HOST:PORT [--key KEY]`: llama-bench rows measured on a remote
device through TVM RPC (the system device farms use), not on this machine.

    remote = connect("192.168.1.7:9090")                    # an RPC server (phone app, tvm_rpc)
    remote = connect("tracker.lan:9190", key="android")     # or a tracker that hands one out
    rows = rpc_bench(artifact_dir, manifest, remote, spec)  # rows as arkinfer.pipeline.bench

What runs where: the artifact's library is uploaded to the remote's work folder and loaded there,
the weights and the KV cache live on the remote device, and every timing is TVM's own
`time_evaluator` on the remote (the host only sends calls and reads back the seconds):
- library: `device/<variant>.so` when the remote has an OpenCL device and the artifact holds a
  linked one (an `export_library` of the device build with the Android NDK), else the host build
  `host/model.so` on the remote's CPU (what a loopback server or a same-arch board can load);
- `pp<p>` at depth d: the cache holds d tokens (prefilled once, not timed), then `prefill` of p
  tokens is timed `repetitions` times after `warmup` runs; avg_ts = p / seconds, TTFT = seconds;
- `tg<n>` at depth d: one `decode` step at context d + n/2 (the middle of the n steps) is timed;
  avg_ts = 1 / seconds per token, samples_ns = n steps at that speed. (A time_evaluator call repeats
  one function on fixed inputs, so it cannot grow the cache between steps.)
Every network step is bounded. TVM's client has no timeout of its own once connected (a server
that accepts and never answers, or an HTTP server, blocked `rpc.connect` for ever), so
`bench_remote` runs the whole remote part in a child process (`python -m` this module) that
reports each step before it starts (connect, upload, weights, each timed call) on its stdout; the
parent gives each step `spec.rpc_timeout` seconds (plus 1 s per MiB for uploads, and one timeout
per run of a timed call) and ends the child when a step overruns: one RPCError naming the step.
Inside the child the address is still probed with `PROBE_TIMEOUT_S` first, a tracker must list a
free server for the key, and the session carries `session_timeout` for the server's side.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from arkinfer.errors import ArkError

PROBE_TIMEOUT_S = 5.0
SESSION_TIMEOUT_S = 600
UPLOAD_BYTES_PER_S = 1 << 20   # the slowest link an upload step is given time for
START_TIMEOUT_S = 120.0        # the child's own start (Python, importing TVM): not a remote step
PROTOCOL = "ARKINFER-RPC "     # prefix of the child's report lines (TVM may print to stdout)
TIMEOUT_HINT = ("check that HOST:PORT is a TVM RPC server (not an HTTP server, nor a tracker "
                "without --key) and that the device is awake; a slow link or device may need a "
                "larger --rpc-timeout")

Step = Callable[..., None]  # step(description, extra_s=0.0): a remote step is about to start
SERVER_HINT = ("start one on the device: `python -m tvm.exec.rpc_server --host 0.0.0.0 --port "
               "9090` (or TVM's Android RPC app / `tvm_rpc server --port=9090`), then pass "
               "--rpc DEVICE_IP:9090")
TRACKER_HINT = ("start the tracker (`python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port 9190`)"
                " and register a server with it (`python -m tvm.exec.rpc_server "
                "--tracker=TRACKER_IP:9190 --key KEY`)")


class RPCError(ArkError):
    """A TVM RPC server or tracker cannot be reached or used."""


@dataclass
class Remote:
    """An open RPC session and what it was opened from."""

    session: Any
    address: str
    key: str | None

    def device_name(self, device: Any) -> str:
        """What the remote says its device is: the OpenCL device name, or the CPU's name when
        the remote runtime can tell (a full TVM server can, a runtime-only one may not)."""
        name = None
        try:
            name = device.device_name
            if name is None and "cpu" in str(device):
                name = self.session.get_function("tvm.codegen.llvm.GetHostCPUName")() + " CPU"
        except Exception:  # noqa: BLE001  device APIs differ in what they report
            pass
        where = self.address + (f", key {self.key}" if self.key else "")
        return f"{name or str(device).split(':')[-2]} (remote, TVM RPC {where})"


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RPCError(f"--rpc {text!r} is not HOST:PORT", hint="e.g. --rpc 192.168.1.7:9090")
    return host, int(port)


def _probe(host: str, port: int, what: str, hint: str) -> None:
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as e:
        raise RPCError(f"cannot reach the TVM RPC {what} at {host}:{port} "
                       f"({e.strerror or e.__class__.__name__}, waited at most "
                       f"{PROBE_TIMEOUT_S:.0f} s)", hint=hint) from None


def connect(address: str, key: str | None = None,
            session_timeout: float = SESSION_TIMEOUT_S) -> Remote:
    """An RPC session to the server at `address`, or (with `key`) one the tracker at `address`
    hands out for `key`. Raises RPCError quickly when nothing answers."""
    from tvm import rpc

    host, port = parse_address(address)
    if key is None:
        _probe(host, port, "server", SERVER_HINT)
        try:
            return Remote(rpc.connect(host, port, session_timeout=session_timeout), address, None)
        except Exception as e:  # noqa: BLE001  TVM raises RuntimeError / TVMError
            raise RPCError(f"the TVM RPC server at {address} refused the session: {e}",
                           hint="is it a TVM RPC server (not a tracker)? with a tracker pass "
                           "--key") from None
    _probe(host, port, "tracker", TRACKER_HINT)
    tracker = rpc.connect_tracker(host, port)
    free = _free_servers(tracker, key, address)
    if not free:
        raise RPCError(f"the tracker at {address} has no free server for key {key!r}",
                       hint=TRACKER_HINT.replace("KEY", key))
    box: dict[str, Any] = {}

    def request() -> None:
        try:
            box["session"] = tracker.request(key, session_timeout=session_timeout, max_retry=1)
        except Exception as e:  # noqa: BLE001
            box["error"] = e

    worker = threading.Thread(target=request, daemon=True)
    worker.start()
    worker.join(PROBE_TIMEOUT_S * 6)
    if "session" not in box:
        raise RPCError(f"the tracker at {address} did not hand out a {key!r} server "
                       f"({box.get('error', 'no answer in %.0f s' % (PROBE_TIMEOUT_S * 6))})",
                       hint=TRACKER_HINT.replace("KEY", key))
    return Remote(box["session"], address, key)


def _free_servers(tracker: Any, key: str, address: str) -> int:
    try:
        summary = tracker.summary()
    except Exception as e:  # noqa: BLE001
        raise RPCError(f"the TVM RPC tracker at {address} did not answer its summary ({e})",
                       hint=TRACKER_HINT) from None
    queue = summary.get("queue_info", {}).get(key, {})
    return int(queue.get("free", 0))


def _no_step(description: str, extra_s: float = 0.0) -> None:
    """A `Step` that reports nothing (rpc_bench called in-process)."""


def _upload_step(step: Step, what: str, nbytes: int) -> None:
    step(f"upload {what} ({nbytes / 2**20:.1f} MiB)", nbytes / UPLOAD_BYTES_PER_S)


def upload_library(remote: Remote, artifact_dir: Path, info: dict[str, Any],
                   step: Step = _no_step) -> tuple[Any, Any]:
    """(remote module, remote device): a linked device library on the remote's OpenCL device
    when there is one, else the host build on its CPU (see the module doc)."""
    sess = remote.session
    candidates = []
    step("ask the remote for its devices")
    if sess.cl(0).exist:
        candidates += [(p, sess.cl(0)) for p in sorted((artifact_dir / "device").glob("*.so"))]
    candidates.append((artifact_dir / info["host"]["library"], sess.cpu(0)))
    path, device = next((p, d) for p, d in candidates if p.is_file())
    _upload_step(step, path.name, path.stat().st_size)
    sess.upload(str(path))
    step(f"load {path.name} on the remote")
    try:
        return sess.load_module(path.name), device
    except Exception as e:  # noqa: BLE001
        raise RPCError(f"the remote at {remote.address} cannot load {path.name}: "
                       f"{str(e).splitlines()[0] if str(e) else e}",
                       hint="the host build loads only on a remote with this machine's CPU "
                       "architecture; for a phone link the device build with the NDK "
                       "(device/<variant>.tar -> device/<variant>.so)") from None


def rpc_bench(artifact_dir: str | Path, manifest: dict[str, Any], remote: Remote, spec: Any,
              progress: Step | None = None) -> list[dict[str, Any]]:
    """llama-bench rows (arkinfer.pipeline.bench's fields) measured on `remote`. `progress` is
    told each remote step before it starts (`Step`: description, extra seconds it may need)."""
    from arkinfer.pipeline.bench import bench_row, bench_tokens, common_fields

    from .lower_relax import Signature
    from .runner import load_params, read_module_info
    from .session import TVMSession

    step = progress or _no_step
    artifact_dir = Path(artifact_dir)
    info = read_module_info(artifact_dir)
    signature = Signature.from_json(info)
    spec.check_context(int(signature.cache["max_len"]), manifest["name"])
    module, device = upload_library(remote, artifact_dir, info, step)
    params = load_params(artifact_dir, info)
    _upload_step(step, "the weights", sum(int(getattr(v, "nbytes", 0)) for v in params.values()))
    session = TVMSession(module, device, params, signature)
    need = max(spec.depths) + max(spec.prompts + spec.gens) + 1
    tokens = bench_tokens(_Tokenizer(artifact_dir), need)
    step("ask the remote for its device name")
    common = common_fields(manifest, remote.device_name(device))
    common.update(n_threads=None, backends=f"{manifest['backend']['name']} (TVM RPC)")
    rows = []
    tests = [("pp", p) for p in spec.prompts if p > 0] + [("tg", n) for n in spec.gens if n > 0]
    for depth in spec.depths:
        for kind, size in tests:
            per_call = _time_remote(session, device, tokens, kind, size, depth, spec,
                                    lambda what, extra_s=0.0, name=f"{kind}{size} @ d{depth}":
                                    step(f"{name} on {remote.address}: {what}", extra_s))
            samples = [t * size for t in per_call] if kind == "tg" else per_call
            row = bench_row(common, kind, size, depth, "default", samples, None)
            row["peak_rss_bytes"] = None  # the remote's memory is not measured
            row["huge_page_malloc"] = None  # nor its allocator
            rows.append(row)
    return rows


class _Tokenizer:
    """The artifact's tokenizer as `bench_tokens` asks for it (runner.tokenize)."""

    def __init__(self, artifact_dir: Path) -> None:
        from arkinfer.frontend.tokenizer import load_tokenizer

        self.tokenizer = load_tokenizer(artifact_dir)

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


def _time_remote(session: Any, device: Any, tokens: list[int], kind: str, size: int, depth: int,
                 spec: Any, on_step: Step = _no_step) -> list[float]:
    """Seconds per call of the timed step (one prefill of `size`, or one decode), on the remote."""
    import tvm

    context = depth if kind == "pp" else depth + size // 2
    on_step("empty the cache")
    session.reset()
    if context:
        on_step(f"prefill {context} tokens of context")
        session.step(tokens[:context])
    step = tokens[context:context + size] if kind == "pp" else tokens[context:context + 1]
    entry = "prefill" if kind == "pp" or "decode" not in session.sig.entries else "decode"
    on_step("send the inputs")
    args = [tvm.runtime.tensor(np.asarray([step], np.int64), device),
            tvm.runtime.tensor(np.arange(context, context + len(step), dtype=np.int64), device),
            *session.cache, *session.params]
    session.vm.set_input(entry, *args)  # inputs stay on the remote; only the call is timed
    runs = spec.repetitions + spec.warmup
    on_step(f"{runs} timed runs", (runs - 1) * spec.rpc_timeout)
    timer = session.vm.time_evaluator("invoke_stateful", device, number=1, repeat=runs)
    result = timer(entry)
    return [float(t) for t in result.results[spec.warmup:]]


# -- the child process: every remote step bounded from outside ---------------------------------

def bench_remote(artifact_dir: str | Path, manifest: dict[str, Any], address: str,
                 key: str | None, spec: Any, progress: Callable[[str], None] | None = None,
                 command: list[str] | None = None) -> list[dict[str, Any]]:
    """`bench --rpc`: `connect` then `rpc_bench` in a child process (`command`, default `python
    -m` this module) whose every remote step must finish within `spec.rpc_timeout` seconds (plus
    its extra time); otherwise the child is ended and RPCError names the step. `progress` gets
    each step's description."""
    parse_address(address)
    request = {"artifact_dir": str(artifact_dir), "manifest": manifest, "address": address,
               "key": key, "spec": asdict(spec)}
    command = command or [sys.executable, "-m", __name__]
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=errors)
        try:
            return _follow(proc, request, spec.rpc_timeout, address, progress, errors)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _follow(proc: subprocess.Popen, request: dict[str, Any], timeout: float, address: str,
            progress: Callable[[str], None] | None, errors: Any) -> list[dict[str, Any]]:
    """Read the child's reports until its result, holding each step to its deadline."""
    lines: queue.Queue[bytes] = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(b"")

    threading.Thread(target=read, daemon=True).start()
    try:
        proc.stdin.write(json.dumps(request).encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the child ended at once: the reader sees the end and reports it
    step, deadline = "start the TVM RPC client", time.monotonic() + START_TIMEOUT_S
    budget = START_TIMEOUT_S
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise RPCError(f"the TVM RPC remote at {address} did not finish the step "
                           f"'{step}' within {budget:.0f} s", hint=TIMEOUT_HINT) from None
        if not line:
            proc.wait()
            errors.seek(0)
            tail = errors.read().decode("utf-8", "replace").strip().splitlines()[-1:]
            raise RPCError(f"the TVM RPC client stopped during '{step}' (exit code "
                           f"{proc.returncode}){': ' + tail[0] if tail else ''}",
                           hint=TIMEOUT_HINT)
        if not line.startswith(PROTOCOL.encode()):
            continue  # something TVM printed
        report = json.loads(line[len(PROTOCOL):])
        if "rows" in report:
            return report["rows"]
        if "error" in report:
            raise RPCError(report["error"], hint=report.get("hint"))
        step, budget = report["step"], timeout + float(report.get("extra_s", 0.0))
        deadline = time.monotonic() + budget
        if progress:
            progress(step)


def spec_from_json(fields: dict[str, Any]) -> Any:
    """The BenchSpec that `asdict` gave `fields` (its tuples arrive as JSON lists)."""
    from arkinfer.pipeline.bench import BenchSpec

    return BenchSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def _child() -> None:
    """The child's side: read the request on stdin, report each step and the result (or the
    error) as PROTOCOL lines on the original stdout; fd 1 goes to stderr so nothing else lands
    there."""
    from arkinfer.errors import ArkError

    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def report(**fields: Any) -> None:
        out.write(PROTOCOL + json.dumps(fields) + "\n")
        out.flush()

    from tvm import rpc  # noqa: F401  imported before the first step: its time is not remote

    request = json.loads(sys.stdin.read())
    spec = spec_from_json(request["spec"])
    address = request["address"]
    step = "connect"
    try:
        def on_step(description: str, extra_s: float = 0.0) -> None:
            nonlocal step
            step = description
            report(step=description, extra_s=extra_s)

        on_step(f"connect to {address}")
        remote = connect(address, request["key"])
        report(rows=rpc_bench(request["artifact_dir"], request["manifest"], remote, spec,
                              on_step))
    except ArkError as e:
        report(error=e.message, hint=e.hint)
    except Exception as e:  # noqa: BLE001  TVM raises TVMError / RPCError from the remote
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        trace = "\n" + traceback.format_exc() if os.environ.get("ARKINFER_DEBUG") else ""
        report(error=f"the TVM RPC remote at {address} failed during '{step}': {first}{trace}",
               hint="see the RPC server's log on the device (ARKINFER_DEBUG=1 adds the client's "
               "traceback here)")


if __name__ == "__main__":
    _child()
