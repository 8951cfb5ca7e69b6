"""`fencepost cluster shutdown` under keyed load, then a restart on the same data dirs.

Every broker exits 0 with its store clean at the same entry; the leader refuses writes
once asked; the restarted cluster serves every acknowledged task exactly once, in a
higher epoch, without any snapshot download (the stores are at the log's end).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from broker.api.client import BrokerUnavailable, Client, ClientError
from broker.server.leading.leader_shutdown import HOLD_ENV
from devtools.devcluster import DevCluster
from election.local.store_status import read_status
from election.shutdown_node import read_shutdown
from election.wire import codes
from election.zk import close, connect
from tests.support.harness import BrokerCluster, call, wait_for
from tests.support.shutdown_prober import ShutdownProber

pytestmark = [pytest.mark.integration]

QUEUE = "load"
# Log lines of a store that had to be verified, rebuilt or joined by snapshot at start.
NOT_AT_THE_END = (
    "installing a snapshot",
    "installed snapshot",
    "not closed in order",
    "rebuilding the state store",
)


class KeyedLoad:
    """Threads submitting one task per fresh key until stopped or refused; acked keys recorded."""

    def __init__(self, zk_hosts: str, cluster: str, threads: int = 3) -> None:
        self.acked: dict[str, str] = {}
        self.refusals: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._run, args=(zk_hosts, cluster, i), daemon=True)
            for i in range(threads)
        ]

    def _run(self, zk_hosts: str, cluster: str, index: int) -> None:
        with Client(zk=zk_hosts, cluster=cluster, timeout=5) as client:
            n = 0
            while not self.stop.is_set():
                key = f"p{index}-{n}"
                try:
                    task_id = client.submit(QUEUE, f"task {key}".encode(), key=key)
                except (ClientError, BrokerUnavailable) as exc:  # the shutdown: no more writes
                    with self.lock:
                        self.refusals.append(exc.code)
                    return
                with self.lock:
                    self.acked[key] = task_id
                n += 1

    def __enter__(self) -> "KeyedLoad":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def count(self) -> int:
        with self.lock:
            return len(self.acked)


def assert_every_acked_task_once(
    zk_hosts: str, cluster: str, leader_address: str, acked: dict[str, str], unacked_at_most: int
) -> None:
    with Client(zk=zk_hosts, cluster=cluster, timeout=30) as client:
        # Submitting every key again returns the same task: present, and never created twice.
        keys = list(acked)
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            again = client.submit_many(
                [{"queue": QUEUE, "payload": f"task {k}".encode(), "key": k} for k in chunk]
            )
            assert again == [acked[k] for k in chunk], "an acknowledged task is missing or was created again"
    depth = call(leader_address, "status")["queues"][QUEUE]
    stored = sum(depth.values())
    assert len(acked) <= stored <= len(acked) + unacked_at_most, (stored, len(acked))


def run_shutdown(procs, zk_hosts: str, cluster: str, timeout: float = 60) -> dict:
    result = procs.run(
        ["cluster", "shutdown", "--json", "--timeout", str(timeout), "--zk", zk_hosts, "--cluster", cluster],
        timeout=timeout + 30,
    )
    assert result.returncode == 0, (result.stdout.decode(), result.stderr.decode())
    return json.loads(result.stdout)


def assert_stores_clean(data_dirs: list[Path], report: dict) -> None:
    for data in data_dirs:
        status = read_status(data)
        assert status is not None and status.clean, (data, status)
        assert status.shutdown_id == report["shutdown_id"]
        assert list(status.position) == report["position"]


@pytest.mark.timeout(240)
def test_shutdown_under_load_then_restart_serves_every_task_without_a_snapshot(cluster, procs):
    # The leader holds its last entry half a second, so the prober's writes meet the refusal.
    bookies = procs.start_bookies(cluster, 3)
    brokers = procs.start_brokers(cluster, 3, env={HOLD_ENV: "0.5"})
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
    cluster, hosts = bc.cluster.name, bc.zk_hosts
    first = bc.wait_leader()
    leader = bc.leader_proc()
    with KeyedLoad(hosts, cluster) as load:
        wait_for(lambda: load.count() > 300, 60, "load to start")
        with ShutdownProber(leader.address) as prober:
            report = run_shutdown(bc.procs, hosts, cluster)
    assert report["ok"] and report["position"] is not None
    ids = sorted(json.loads((p.data_dir / ".broker.meta").read_text())["broker_id"] for p in bc.brokers)
    assert sorted(m["id"] for m in report["members"]) == ids
    assert all(m["state"] == "clean" and m["position"] == report["position"] for m in report["members"])
    for proc in bc.brokers:
        assert proc.wait(30) == 0, proc.output()[-3000:]
        assert "Traceback" not in proc.output()
    assert_stores_clean([p.data_dir for p in bc.brokers], report)
    # The leader refused writes once asked, and accepted none sent after its first refusal.
    refused = [rid for rid, code in prober.replies if code == codes.E_SHUTTING_DOWN]
    accepted = [rid for rid, code in prober.replies if code is None]
    assert refused, prober.replies[-20:]
    assert not accepted or max(accepted) < min(refused), (max(accepted), min(refused))
    assert "refusing writes from now on" in leader.output()
    # Bookies keep running; nobody leads while the cluster is down.
    assert all(b.alive() for b in bc.bookies)
    assert bc.leader_info() is None
    assert read_shutdown(bc.cluster.zk, bc.cluster.paths)["shutdown_id"] == report["shutdown_id"]

    restarted = [bc.procs.restart(p) for p in bc.brokers]
    bc.brokers[:] = restarted
    second = bc.wait_leader(timeout=60)
    assert second["epoch"] > first["epoch"]
    wait_for(lambda: read_shutdown(bc.cluster.zk, bc.cluster.paths) is None, 30, "the shutdown node to go")
    assert_every_acked_task_once(hosts, cluster, second["address"], load.acked, unacked_at_most=3)
    for proc in restarted:
        out = proc.output()
        assert not [line for line in NOT_AT_THE_END if line in out], out[-3000:]
        # Each store carried on from the shutdown's entry, not from a snapshot.
        status = read_status(proc.data_dir)
        assert status is not None and not status.clean and status.cluster_id


@pytest.mark.timeout(300)
def test_dev_up_again_after_a_shutdown_restarts_the_brokers_on_their_data(tmp_path, procs):
    """`dev up`, load, `cluster shutdown`, `dev up` on the same dir: the same stores serve on."""
    dev_dir = tmp_path / "dev"
    up = procs.run(["dev", "up", "--dev-dir", str(dev_dir)], timeout=120)
    assert up.returncode == 0, up.stderr.decode()
    dev = DevCluster(dev_dir)
    try:
        state = dev.read_state()
        hosts, cluster = state["zk"], state["cluster"]
        zk = connect(hosts)
        try:
            from election.leader import read_leader
            from election.paths import ClusterPaths

            paths = ClusterPaths(cluster)
            first = wait_for(lambda: read_leader(zk, paths), 60, "a leader")
            with KeyedLoad(hosts, cluster, threads=2) as load:
                wait_for(lambda: load.count() > 100, 60, "load to start")
                report = run_shutdown(procs, hosts, cluster)
            brokers = [m for m in state["processes"] if m["kind"] == "broker"]
            wait_for(lambda: not any(_alive(m["pid"]) for m in brokers), 30, "the brokers to exit")
            assert_stores_clean([Path(m["data_dir"]) for m in brokers], report)
            again = procs.run(["dev", "up", "--dev-dir", str(dev_dir)], timeout=120)
            assert again.returncode == 0, again.stderr.decode()
            second = wait_for(
                lambda: (
                    (read_leader(zk, paths) or {}).get("epoch", 0) > first["epoch"] and read_leader(zk, paths)
                ),
                60,
                "a leader of a later epoch",
            )
            assert_every_acked_task_once(hosts, cluster, second["address"], load.acked, unacked_at_most=2)
            for m in brokers:  # one log per member across both runs: read the second run's part
                out = Path(m["log"]).read_text(errors="replace").rsplit("starting on", 1)[-1]
                assert not [line for line in NOT_AT_THE_END if line in out], out[-3000:]
        finally:
            close(zk)
    finally:
        dev.down()


def _alive(pid: int) -> bool:
    from devtools.procs import pid_alive

    return pid_alive(pid)
