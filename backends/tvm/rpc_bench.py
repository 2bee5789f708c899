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
Every network step is bounded: the address is probed with `PROBE_TIMEOUT_S` before TVM's own
connect (which retries for a minute), a tracker must list a free server for the key, and the
session is opened with `session_timeout` so a stalled remote ends the session.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from arkinfer.errors import ArkError

PROBE_TIMEOUT_S = 5.0
SESSION_TIMEOUT_S = 600
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


def upload_library(remote: Remote, artifact_dir: Path, info: dict[str, Any]) -> tuple[Any, Any]:
    """(remote module, remote device): a linked device library on the remote's OpenCL device
    when there is one, else the host build on its CPU (see the module doc)."""
    sess = remote.session
    candidates = []
    if sess.cl(0).exist:
        candidates += [(p, sess.cl(0)) for p in sorted((artifact_dir / "device").glob("*.so"))]
    candidates.append((artifact_dir / info["host"]["library"], sess.cpu(0)))
    path, device = next((p, d) for p, d in candidates if p.is_file())
    sess.upload(str(path))
    try:
        return sess.load_module(path.name), device
    except Exception as e:  # noqa: BLE001
        raise RPCError(f"the remote at {remote.address} cannot load {path.name}: "
                       f"{str(e).splitlines()[0] if str(e) else e}",
                       hint="the host build loads only on a remote with this machine's CPU "
                       "architecture; for a phone link the device build with the NDK "
                       "(device/<variant>.tar -> device/<variant>.so)") from None


def rpc_bench(artifact_dir: str | Path, manifest: dict[str, Any], remote: Remote, spec: Any,
              progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """llama-bench rows (arkinfer.pipeline.bench's fields) measured on `remote`."""
    from arkinfer.pipeline.bench import _common_fields, _row, bench_tokens

    from .lower_relax import Signature
    from .runner import load_params, read_module_info
    from .session import TVMSession

    artifact_dir = Path(artifact_dir)
    info = read_module_info(artifact_dir)
    module, device = upload_library(remote, artifact_dir, info)
    session = TVMSession(module, device, load_params(artifact_dir, info), Signature.from_json(info))
    need = max(spec.depths) + max(spec.prompts + spec.gens) + 1
    tokens = bench_tokens(_Tokenizer(artifact_dir), need)
    common = _common_fields(manifest, remote.device_name(device))
    common.update(n_threads=None, backends=f"{manifest['backend']['name']} (TVM RPC)")
    rows = []
    tests = [("pp", p) for p in spec.prompts if p > 0] + [("tg", n) for n in spec.gens if n > 0]
    for depth in spec.depths:
        for kind, size in tests:
            if progress:
                progress(f"{kind}{size} @ d{depth} on {remote.address}")
            per_call = _time_remote(session, device, tokens, kind, size, depth, spec)
            samples = [t * size for t in per_call] if kind == "tg" else per_call
            row = _row(common, kind, size, depth, "default", samples, None)
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
                 spec: Any) -> list[float]:
    """Seconds per call of the timed step (one prefill of `size`, or one decode), on the remote."""
    import tvm

    context = depth if kind == "pp" else depth + size // 2
    session.reset()
    if context:
        session.prefill(tokens[:context])
    step = tokens[context:context + size] if kind == "pp" else tokens[context:context + 1]
    entry = "prefill" if kind == "pp" or "decode" not in session.sig.entries else "decode"
    args = [tvm.runtime.tensor(np.asarray([step], np.int64), device),
            tvm.runtime.tensor(np.arange(context, context + len(step), dtype=np.int64), device),
            *session.cache, *session.params]
    session.vm.set_input(entry, *args)  # inputs stay on the remote; only the call is timed
    timer = session.vm.time_evaluator("invoke_stateful", device, number=1,
                                      repeat=spec.repetitions + spec.warmup)
    result = timer(entry)
    return [float(t) for t in result.results[spec.warmup:]]
