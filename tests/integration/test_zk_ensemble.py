"""`fencepost zk start --servers 3`: a real 3-server ensemble reaches quorum, serves kazoo, outlives a server."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest
from kazoo.protocol.states import KazooState

from devtools.procs import pid_alive
from devtools.zk_ensemble import server_mode
from devtools.zkserver import four_letter, port_in_use
from election.zk import close, connect
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def free_block(count: int, taken: set[int]) -> int:
    """A base port whose ``count`` consecutive ports are free (and not in ``taken``)."""
    while True:
        base = random.randrange(20000, 60000)
        ports = set(range(base, base + count))
        if not ports & taken and not any(port_in_use("127.0.0.1", p) for p in ports):
            taken |= ports
            return base


def test_an_even_server_count_is_a_usage_error(procs, tmp_path):
    result = procs.run(["zk", "start", "--servers", "2", "--data", str(tmp_path / "zk")])
    assert result.returncode == 2
    assert "1, 3 or 5" in result.stderr.decode()


def test_three_servers_reach_quorum_serve_kazoo_and_survive_losing_the_leader(procs, tmp_path):
    taken: set[int] = set()
    client, quorum, election = (free_block(3, taken) for _ in range(3))
    data = tmp_path / "zk"
    zk = None
    try:
        started = procs.run(
            [
                "zk",
                "start",
                "--servers",
                "3",
                "--port",
                str(client),
                "--quorum-port",
                str(quorum),
                "--election-port",
                str(election),
                "--data",
                str(data),
                "--json",
            ],
            timeout=90,
        )
        assert started.returncode == 0, started.stderr.decode()
        info = json.loads(started.stdout)
        assert info["hosts"] == ",".join(f"127.0.0.1:{client + i}" for i in range(3))
        servers = {s["name"]: s for s in info["servers"]}
        assert sorted(servers) == ["zk-1", "zk-2", "zk-3"]
        assert sorted(s["mode"] for s in servers.values()) == ["follower", "follower", "leader"]
        for i, s in enumerate(info["servers"]):
            assert (data / s["name"] / "data" / "myid").read_text().strip() == str(i + 1)

        zk = connect(info["hosts"], session_timeout=4.0)
        states: list[str] = []
        zk.add_listener(states.append)
        zk.create("/ensemble-check", b"0", makepath=True)
        session = zk.client_id[0]

        leader = next(s for s in servers.values() if s["mode"] == "leader")
        os.killpg(leader["pid"], signal.SIGKILL)
        wait_for(lambda: not pid_alive(leader["pid"]), 10, "the leader gone")
        killed_at = time.monotonic()
        # Two servers are a quorum: one of them leads, and the client goes on in the same session.
        wait_for(
            lambda: (
                sorted(str(server_mode(s["address"])) for s in servers.values() if s is not leader)
                == ["follower", "leader"]
            ),
            30,
            "a new leader among the two left",
        )

        def written() -> bool:
            try:
                zk.set("/ensemble-check", b"1")
                return True
            except Exception:
                return False

        wait_for(written, 20, "a write through the ensemble without its old leader")
        back_after = time.monotonic() - killed_at
        assert zk.get("/ensemble-check")[0] == b"1"
        assert zk.client_id[0] == session and KazooState.LOST not in states, states
        print(f"a write went through {back_after:.2f} s after the leader's SIGKILL")
    finally:
        if zk is not None:
            close(zk)
        stopped = procs.run(["zk", "stop", "--data", str(data)])
    assert stopped.returncode == 0, stopped.stderr.decode()
    assert all(four_letter("127.0.0.1", client + i) is None for i in range(3))


def test_dev_up_refuses_an_ensemble_on_test_hosts_and_an_even_count(procs, tmp_path):
    on_hosts = procs.run(
        ["dev", "up", "--dev-dir", str(tmp_path / "d1"), "--zk-servers", "3", "--hosts", "2"]
    )
    assert on_hosts.returncode == 1
    assert "--zk-servers > 1 cannot go with --hosts" in on_hosts.stderr.decode()
    even = procs.run(["dev", "up", "--dev-dir", str(tmp_path / "d2"), "--zk-servers", "2"])
    assert even.returncode == 2
    assert not (tmp_path / "d1" / "cluster.json").exists() and not (tmp_path / "d2").exists()
