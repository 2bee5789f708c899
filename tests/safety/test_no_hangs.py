"""No hangs on a remote that never answers (issue 37, item 4: `bench --rpc`).

Reproduction: `bench TVM_ART --rpc HOST:PORT` against a server that accepts the connection and
never answers (or an HTTP server) ran > 200 s: only the TCP connect had a timeout, and TVM's
client blocks in its handshake for ever. Now every remote step (connect, upload, each timed call)
runs in a child process held to `--rpc-timeout` seconds per step: one RPCError naming the step,
with a hint. The steps after connect are checked with a stand-in child that stalls where a
device would (a real stalled upload needs a server that answers the handshake and then stops).
"""

from __future__ import annotations

import http.server
import re
import socket
import sys
import textwrap
import threading
import time

import pytest

from arkinfer.backend import get_backend
from arkinfer.backends.tvm import rpc_bench as rb
from arkinfer.pipeline.bench import BenchSpec

SPEC = BenchSpec(prompts=(8,), gens=(4,), repetitions=2, warmup=1, rpc_timeout=1.0)
@pytest.fixture
def silent_server():
    """127.0.0.1:PORT that accepts every connection and never sends a byte."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for conn in held:
        conn.close()


@pytest.fixture
def http_server():
    """A plain HTTP server (what `--rpc` may be pointed at by mistake)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("server", ["silent_server", "http_server"])
def test_a_server_that_never_answers_times_out_on_connect(request, tmp_path, server):
    if not get_backend("tvm").available():
        pytest.skip("tvm is not installed")
    address = request.getfixturevalue(server)
    steps: list[str] = []
    start = time.monotonic()
    with pytest.raises(rb.RPCError) as err:
        get_backend("tvm").bench_remote(tmp_path, {"name": "art"}, address, None, SPEC,
                                        progress=steps.append)
    assert err.value.message == (f"the TVM RPC remote at {address} did not finish the step "
                                 f"'connect to {address}' within 1 s")
    assert "--rpc-timeout" in err.value.hint and "HTTP server" in err.value.hint
    assert steps == [f"connect to {address}"]
    assert time.monotonic() - start < 30  # a start of a few seconds, then 1 s


def _stand_in(script: str) -> list[str]:
    """A child that speaks the report protocol as the script says (`report(**fields)`)."""
    prelude = textwrap.dedent(f"""
        import json, sys, time
        sys.stdin.read()
        def report(**fields):
            print({rb.PROTOCOL!r} + json.dumps(fields), flush=True)
    """)
    return [sys.executable, "-c", prelude + textwrap.dedent(script)]


@pytest.mark.parametrize("step", ["upload model.so (12.0 MiB)",
                                  "pp8 @ d0 on HOST: 3 timed runs"])
def test_every_remote_step_has_its_own_deadline(tmp_path, step):
    child = _stand_in(f"""
        report(step="connect to HOST")
        report(step={step!r})
        print("something TVM printed", flush=True)
        time.sleep(60)
    """)
    start = time.monotonic()
    message = f"did not finish the step '{step}' within 1 s"
    with pytest.raises(rb.RPCError, match=re.escape(message)):
        rb.bench_remote(tmp_path, {}, "127.0.0.1:9090", None, SPEC, command=child)
    assert time.monotonic() - start < 10


def test_a_step_gets_its_extra_time_and_the_rows_come_back(tmp_path):
    child = _stand_in("""
        report(step="upload the weights (2.0 MiB)", extra_s=3.0)
        time.sleep(2)
        report(rows=[{"test": "pp8"}])
    """)
    seen: list[str] = []
    rows = rb.bench_remote(tmp_path, {}, "127.0.0.1:9090", None, SPEC, progress=seen.append,
                           command=child)
    assert rows == [{"test": "pp8"}] and seen == ["upload the weights (2.0 MiB)"]


def test_a_child_that_dies_or_fails_is_one_error(tmp_path):
    dies = _stand_in("""
        report(step="connect to HOST")
        sys.stderr.write("Segmentation fault\\n")
        sys.exit(3)
    """)
    with pytest.raises(rb.RPCError, match="stopped during 'connect to HOST' .exit code 3.: "
                                          "Segmentation fault"):
        rb.bench_remote(tmp_path, {}, "127.0.0.1:9090", None, SPEC, command=dies)
    fails = _stand_in("""report(error="the remote cannot load model.so", hint="link it")""")
    with pytest.raises(rb.RPCError, match="cannot load model.so") as err:
        rb.bench_remote(tmp_path, {}, "127.0.0.1:9090", None, SPEC, command=fails)
    assert err.value.hint == "link it"


def test_the_spec_survives_the_trip_to_the_child():
    import json
    from dataclasses import asdict

    assert rb.spec_from_json(json.loads(json.dumps(asdict(SPEC)))) == SPEC
