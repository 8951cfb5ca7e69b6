"""The delayer on a real kernel: two network namespaces on a veth pair, the packets the client
receives sent to NFQUEUE. With a 40 ms delayer the TCP round trip grows by about 40 ms, bulk data
keeps flowing at speed (holding packets at INPUT, not OUTPUT, is what spares it TCP's small-queue
throttle: see the delayer's docstring), a second delayer on the same queue is refused, and once the
delayer stops the traffic passes undelayed (``--queue-bypass``)."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from devtools.procs import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

SERVER_IP, CLIENT_IP, PORT = "10.213.250.1", "10.213.250.2", 7300
DELAY_MS = 40
BULK_BYTES = 2_000_000
# About 0.3 s at 40 ms with the delay on INPUT; a sender whose own data is held (OUTPUT) needs ~30 s.
BULK_LIMIT_S = 5.0

# Echoes every connection's bytes back, one thread per connection.
ECHO_SERVER = """
import socket, sys, threading
def echo(conn):
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
while True:
    threading.Thread(target=echo, args=(srv.accept()[0],), daemon=True).start()
"""

# The median of 20 one-byte round trips, then the time to send BULK bytes and read them back.
CLIENT = """
import json, socket, statistics, sys, threading, time
host, port, bulk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with socket.create_connection((host, port), timeout=10) as conn:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(20):
        start = time.monotonic()
        conn.sendall(b"x")
        assert conn.recv(1) == b"x"
        rtts.append(time.monotonic() - start)
    start = time.monotonic()
    threading.Thread(target=conn.sendall, args=(b"b" * bulk,), daemon=True).start()
    got = 0
    while got < bulk:
        chunk = conn.recv(65536)
        assert chunk, "connection closed mid-transfer"
        got += len(chunk)
    bulk_s = time.monotonic() - start
print(json.dumps({"rtt_ms": statistics.median(rtts) * 1000, "bulk_s": bulk_s}))
"""


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces and iptables need root"
    for tool in ("ip", "iptables"):
        if not shutil.which(tool):
            return f"no `{tool}` on PATH (Debian packages iproute2, iptables)"
    return None


def _sh(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{' '.join(command)}: {done.stderr.strip()}"


def _in(netns: str, *command: str) -> list[str]:
    return ["ip", "netns", "exec", netns, *command]


def _first_line(proc: subprocess.Popen, timeout: float) -> str:
    """The process's first stdout line (a readiness line), without guessing how long it takes."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"{proc.args} printed nothing in {timeout} s"
    return proc.stdout.readline().strip()


def _measure(netns: str) -> dict[str, float]:
    done = subprocess.run(
        _in(netns, sys.executable, "-c", CLIENT, SERVER_IP, str(PORT), str(BULK_BYTES)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _start(command: list[str], procs: list[subprocess.Popen]) -> subprocess.Popen:
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    procs.append(proc)
    return proc


def _delayer(netns: str) -> list[str]:
    return _in(
        netns, sys.executable, "-m", "devtools.hosts.delayer", "--queue-num", "0", "--delay-ms", str(DELAY_MS)
    )


@pytest.fixture
def hosts() -> Iterator[tuple[str, str, list[subprocess.Popen]]]:
    """A server and a client namespace on a veth pair; the processes started in them are killed after."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    suffix = uuid.uuid4().hex[:6]
    server, client = f"fpdl{suffix}s", f"fpdl{suffix}c"
    procs: list[subprocess.Popen] = []
    made: list[str] = []
    try:
        for netns in (server, client):
            if subprocess.run(["ip", "netns", "add", netns], capture_output=True).returncode != 0:
                pytest.skip("cannot create network namespaces here")
            made.append(netns)
        _sh(
            "ip",
            "link",
            "add",
            server,
            "netns",
            server,
            "type",
            "veth",
            "peer",
            "name",
            client,
            "netns",
            client,
        )
        for netns, address in ((server, SERVER_IP), (client, CLIENT_IP)):
            _sh(*_in(netns, "ip", "addr", "add", f"{address}/24", "dev", netns))
            _sh(*_in(netns, "ip", "link", "set", netns, "up"))
        yield server, client, procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)
        for netns in made:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)


def test_delayer_adds_latency_then_steps_aside(hosts: tuple[str, str, list[subprocess.Popen]]) -> None:
    server, client, procs = hosts
    echo = _start(_in(server, sys.executable, "-c", ECHO_SERVER, SERVER_IP, str(PORT)), procs)
    assert _first_line(echo, 15) == "listening"
    plain = _measure(client)

    _sh(
        *_in(
            client,
            "iptables",
            "-A",
            "INPUT",
            "-i",
            client,
            "-j",
            "NFQUEUE",
            "--queue-num",
            "0",
            "--queue-bypass",
        )
    )
    delayer = _start(_delayer(client), procs)
    assert _first_line(delayer, 15) == f"delayer: queue 0, {DELAY_MS} ms"
    delayed = _measure(client)
    print(f"without delay {plain}, with {DELAY_MS} ms {delayed}")
    assert 35 <= delayed["rtt_ms"] - plain["rtt_ms"] < 200
    assert delayed["bulk_s"] < BULK_LIMIT_S, f"{BULK_BYTES} bytes echoed in {delayed['bulk_s']:.1f} s"

    # The queue is taken: a second delayer is refused with a one-line reason.
    second = subprocess.run(_delayer(client), capture_output=True, text=True, timeout=30, cwd=REPO_ROOT)
    assert second.returncode == 1
    assert second.stderr.startswith("delayer error: cannot bind queue 0") and second.stderr.count("\n") == 1

    delayer.send_signal(signal.SIGTERM)
    assert delayer.wait(timeout=10) == 0, delayer.stderr.read()
    after = _measure(client)
    assert after["rtt_ms"] < plain["rtt_ms"] + 20, (plain, after)
