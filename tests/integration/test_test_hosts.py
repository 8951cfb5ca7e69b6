"""Test hosts on a real bridge: isolation, cuts, CPU caps and cleanup (devtools/hosts; root only)."""

from __future__ import annotations

import errno
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from devtools.hosts.netns import NETNS_DIR, run
from devtools.hosts.testnet import TestNet, hosts_unsupported
from devtools.procs import pid_alive

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.skipif(hosts_unsupported() is not None, reason=hosts_unsupported() or ""),
]

ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7000)); s.listen(); print("listening", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"hi"); c.close()
"""

CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as s:
        print(s.recv(2).decode())
except OSError as exc:
    print(f"errno {exc.errno}" if exc.errno else "timeout")
"""


def reaches(net: TestNet, host: str, address: str, port: int = 7000, timeout: float = 1.0) -> str:
    """What a TCP connect from ``host`` (``local``: this process's machine) to ``address`` got."""
    command = [sys.executable, "-c", CONNECT, address, str(port), str(timeout)]
    if host != "local":
        command = net.command(host, command)
    return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip()


def start_echo(net: TestNet, host: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        net.command(host, [sys.executable, "-c", ECHO, net.address(host)]), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "listening"
    return proc


def gone(record: dict) -> list[str]:
    """What of a destroyed network is still there (empty: nothing)."""
    left = [h["netns"] for h in record["hosts"].values() if (NETNS_DIR / h["netns"]).exists()]
    if run(["ip", "link", "show", "dev", record["bridge"]], check=False).returncode == 0:
        left.append(record["bridge"])
    left += [
        h["veth"]
        for h in record["hosts"].values()
        if run(["ip", "link", "show", h["veth"]], check=False).returncode == 0
    ]
    left += [h["cgroup"] for h in record["hosts"].values() if h.get("cgroup") and Path(h["cgroup"]).exists()]
    if record["bridge"] in run(["iptables", "-S", "FORWARD"]).stdout:
        left.append("FORWARD guard rules")
    return left


@pytest.fixture
def net(tmp_path):
    net = TestNet(tmp_path / "run")
    net.run_dir.mkdir()
    try:
        yield net
    finally:
        net.destroy()


def test_hosts_reach_each_other_and_the_machine_but_nothing_beyond(net):
    record = net.create(["zk", "h1", "h2"])
    echo = start_echo(net, "h2")
    try:
        assert reaches(net, "h1", net.address("h2")) == "hi"
        assert reaches(net, "local", net.address("h2")) == "hi"
        assert net.isolation_problems() == []
        for host in record["hosts"].values():
            assert run(["ip", "netns", "exec", host["netns"], "ip", "route", "show", "default"]).stdout == ""
        # No route out: the connect fails at once and nothing is sent (a documentation-only address).
        assert reaches(net, "h1", "203.0.113.7", port=80) == f"errno {errno.ENETUNREACH}"
        assert run(["iptables", "-t", "nat", "-S"]).stdout.count("10.213.") == 0
    finally:
        echo.kill()


def test_a_cut_drops_traffic_both_ways_until_healed_and_a_one_way_cut_only_one_way(net):
    net.create(["h1", "h2", "h3"])
    echoes = [start_echo(net, h) for h in ("h1", "h2", "h3")]
    try:
        net.partition(["h1"], ["h2", "local"])
        assert reaches(net, "h1", net.address("h2")) == "timeout"
        assert reaches(net, "h2", net.address("h1")) == "timeout"
        assert reaches(net, "local", net.address("h1")) == "timeout"
        assert reaches(net, "h3", net.address("h1")) == "hi"
        net.heal("h1")
        assert reaches(net, "h1", net.address("h2")) == "hi"
        assert reaches(net, "local", net.address("h1")) == "hi"
        # h1 no longer hears h3: h3's SYN is lost, while h1's packets still reach h3 (its SYN is
        # answered, but the answer is what h1 does not hear).
        net.partition(["h1"], ["h3"], one_way=True)
        assert net.cuts() == [("h3", "h1")]
        assert reaches(net, "h3", net.address("h1")) == "timeout"
        assert reaches(net, "h2", net.address("h1")) == "hi"
        net.heal()
        assert net.cuts() == [] and reaches(net, "h3", net.address("h1")) == "hi"
    finally:
        for echo in echoes:
            echo.kill()


BUSY = "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end: pass\nimport os; print(os.times().user + os.times().system)"


def test_a_host_gets_no_more_cpu_than_its_quota(net):
    net.create(["h1"], cpus=0.2)
    done = subprocess.run(
        net.command("h1", [sys.executable, "-c", BUSY]), capture_output=True, text=True, timeout=60
    )
    used = float(done.stdout.strip())
    # 1.5 s of spinning at 0.2 of a core: about 0.3 s of CPU (start-up included), never a whole core's 1.5 s.
    assert used < 0.6, f"the capped host used {used:.2f} s of CPU in 1.5 s"


def test_a_network_whose_maker_was_killed_is_removed_from_its_record(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    maker = textwrap.dedent(
        f"""
        import os, signal, subprocess, sys
        from pathlib import Path
        from devtools.hosts.testnet import TestNet
        net = TestNet(Path({str(run_dir)!r}))
        net.create(["zk", "h1"], cpus=0.5, latency_ms=5)
        sleeper = subprocess.Popen(net.command("h1", ["sleep", "600"]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print("made", sleeper.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    net = TestNet(run_dir)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", maker],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).parents[2],
        )
        assert proc.returncode == -signal.SIGKILL and "made" in proc.stdout, proc.stderr
        record = net.read()
        assert gone(record) != []
        net.destroy()
        assert gone(record) == []
        # What ran on the host (and its delayer) went with it.
        sleeper = int(proc.stdout.split()[1])
        assert (
            not Path(f"/proc/{sleeper}").exists()
            or "Z" in Path(f"/proc/{sleeper}/stat").read_text().split()[2]
        )
        assert all(not pid_alive(h["delayer_pid"]) for h in record["hosts"].values() if h["delayer_pid"])
    finally:
        net.destroy()


def test_destroy_twice_and_ensure_after_destroy_rebuild_the_same_addresses(net):
    record = net.create(["h1", "h2"])
    net.destroy()
    net.destroy()
    assert gone(record) == []
    again = net.ensure()
    assert (
        again["index"] == record["index"]
        and again["hosts"]["h1"]["address"] == record["hosts"]["h1"]["address"]
    )
    echo = start_echo(net, "h2")
    try:
        assert reaches(net, "h1", net.address("h2")) == "hi"
    finally:
        echo.kill()


RTT = """
import socket, statistics, sys, time
times = []
for _ in range(5):
    t = time.monotonic()
    with socket.create_connection((sys.argv[1], 7000), timeout=5) as s:
        s.recv(2)
    times.append(time.monotonic() - t)
print(statistics.median(times) * 1000)
"""


def test_latency_adds_to_every_round_trip_through_the_host_and_can_be_removed(net):
    net.create(["h1", "h2"])
    echo = start_echo(net, "h2")
    try:

        def rtt_ms() -> float:
            command = net.command("h1", [sys.executable, "-c", RTT, net.address("h2")])
            return float(subprocess.run(command, capture_output=True, text=True, timeout=60).stdout)

        net.set_latency("h2", 30)
        # A connect and its first reply: two round trips, each at least 30 ms longer.
        assert rtt_ms() >= 55
        net.set_latency("h2", 0)
        assert rtt_ms() < 30
    finally:
        echo.kill()
