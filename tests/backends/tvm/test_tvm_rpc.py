"""`arkinfer bench ARTIFACT --rpc HOST:PORT [--key KEY]`: a real TVM RPC tracker and server
(`python -m tvm.exec.rpc_tracker` / `rpc_server`, what a device farm runs) started here on
127.0.0.1 with free ports, the demo's tvm artifact uploaded and timed there by time_evaluator;
a stopped server or an unknown key is one clear error within seconds, never a hang."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arkinfer.backend import get_backend
from arkinfer.cli.main import app

if not get_backend("tvm").available():
    pytest.skip("tvm is not installed", allow_module_level=True)
pytest.importorskip("tornado", reason="TVM's RPC tracker needs tornado")
pytest.importorskip("cloudpickle", reason="TVM's RPC server needs cloudpickle")

from arkinfer.backends.tvm import rpc_bench as rb  # noqa: E402

cli = CliRunner()
KEY = "android"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(module: str, *args: str) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", f"tvm.exec.{module}", "--host", "127.0.0.1",
                             "--port", str(port), "--port-end", str(port + 1), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its own group: the server forks a worker
    return proc, port


def _wait(port: int, seconds: float = 90) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {seconds} s")


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


@pytest.fixture(scope="module")
def rpc():
    """A standalone server, and a tracker with a second server registered under KEY (all
    started at once, all torn down after)."""
    tracker, tport = _start("rpc_tracker")
    procs = [tracker]
    try:
        server, sport = _start("rpc_server")
        procs.append(server)
        _wait(tport)
        keyed, _ = _start("rpc_server", "--tracker", f"127.0.0.1:{tport}", "--key", KEY)
        procs.append(keyed)
        _wait(sport)
        end = time.monotonic() + 90  # the keyed server registers once it is up
        while rb._free_servers(_tracker(tport), KEY, "") < 1:
            assert time.monotonic() < end, "the server never registered with the tracker"
            time.sleep(0.3)
        yield {"server_port": sport, "tracker_port": tport}
    finally:
        for proc in procs:
            _stop(proc)


def _tracker(port: int):
    from tvm import rpc

    return rpc.connect_tracker("127.0.0.1", port)


@pytest.fixture(scope="module")
def artifact(tvm_demo_artifact) -> Path:
    """The demo's tvm artifact (conftest: built once per session); the remote here is this
    machine, so the bench uploads its host library."""
    return tvm_demo_artifact[0]


def _bench(artifact: Path, *extra: str) -> list[dict]:
    res = cli.invoke(app, ["bench", str(artifact), "-p", "16", "-n", "8", "-d", "0,8", "-r",
                           "2", "--warmup", "1", "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout[res.stdout.index("["):])


def test_bench_on_an_rpc_server(rpc, artifact):
    rows = _bench(artifact, "--rpc", f"127.0.0.1:{rpc['server_port']}")
    assert [(r["test"], r["n_depth"]) for r in rows] == [("pp16", 0), ("tg8", 0), ("pp16", 8),
                                                         ("tg8", 8)]
    for r in rows:
        assert "remote, TVM RPC 127.0.0.1:" in r["cpu_info"] and r["backends"] == "tvm (TVM RPC)"
        assert r["avg_ts"] > 0 and len(r["samples_ts"]) == 2 and r["peak_rss_bytes"] is None
    assert rows[0]["ttft_ms"] > 0 and rows[1]["ttft_ms"] is None


def test_bench_through_the_tracker(rpc, artifact):
    rows = _bench(artifact, "--rpc", f"127.0.0.1:{rpc['tracker_port']}", "--key", KEY)
    assert len(rows) == 4 and f"key {KEY}" in rows[0]["cpu_info"]


def test_unknown_key_fails_fast(rpc, artifact):
    t0 = time.monotonic()
    res = cli.invoke(app, ["bench", str(artifact), "--rpc",
                           f"127.0.0.1:{rpc['tracker_port']}", "--key", "no-such-device"])
    assert res.exit_code != 0 and "no free server for key 'no-such-device'" in res.output
    assert "hint:" in res.output and time.monotonic() - t0 < 20


def test_stopped_server_is_one_clear_error_not_a_hang():
    port = _free_port()  # nothing listens there: what a stopped server looks like
    t0 = time.monotonic()
    with pytest.raises(rb.RPCError) as err:
        rb.connect(f"127.0.0.1:{port}")
    assert f"cannot reach the TVM RPC server at 127.0.0.1:{port}" in err.value.message
    assert "rpc_server" in err.value.hint
    with pytest.raises(rb.RPCError, match="cannot reach the TVM RPC tracker"):
        rb.connect(f"127.0.0.1:{port}", key=KEY)
    assert time.monotonic() - t0 < 2 * rb.PROBE_TIMEOUT_S
    with pytest.raises(rb.RPCError, match="is not HOST:PORT"):
        rb.parse_address("localhost")


def test_cli_key_without_rpc_is_refused(tmp_path):
    res = cli.invoke(app, ["bench", str(tmp_path), "--key", KEY])
    assert res.exit_code != 0 and "--key android needs --rpc HOST:PORT" in res.output
