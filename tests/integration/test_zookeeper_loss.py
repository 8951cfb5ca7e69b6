"""ZooKeeper loses its data while the cluster is down; bookies and brokers keep theirs.

A private ZooKeeper is stopped, its data directory wiped and started again on the
same port. After an orderly `cluster shutdown`, `cluster init` plus starting the
brokers again restores every acknowledged task; after a dirty stop the start
aborts with "manual recovery needed" until `store mark-clean` names the newest store.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from broker.api.client import Client
from devtools.procs import free_port
from devtools.zkserver import ZkServerConfig, ZooKeeperServer
from election.local.store_status import read_status
from election.paths import ClusterPaths
from election.zk import close, connect
from tests.support.harness import TestCluster as ZkCluster
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TASKS = 120


class PrivateZooKeeper:
    """A ZooKeeper of this test alone, so that its data directory can be wiped."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.server = ZooKeeperServer(ZkServerConfig(port=free_port(), data=str(root)))
        self.zk = None

    def start(self) -> None:
        self.server.start()
        self.zk = connect(self.server.hosts, session_timeout=4.0)

    def wipe(self) -> None:
        """Stop it, delete every byte it stored, start it again empty on the same port."""
        close(self.zk)
        self.server.stop()
        shutil.rmtree(self.root / "data")
        self.start()

    def stop(self) -> None:
        if self.zk is not None:
            close(self.zk)
        self.server.stop()


@pytest.fixture
def private_zk(tmp_path):
    zk = PrivateZooKeeper(tmp_path / "zookeeper")
    zk.start()
    try:
        yield zk
    finally:
        zk.stop()


def _cluster(private_zk: PrivateZooKeeper) -> ZkCluster:
    name = "survivor"
    return ZkCluster(name=name, hosts=private_zk.server.hosts, zk=private_zk.zk, paths=ClusterPaths(name))


def _start(procs, tc: ZkCluster) -> tuple[list, list]:
    """Three bookies, then three brokers that each wait for the other two (so none answers alone)."""
    bookies = procs.start_bookies(tc, 3)
    brokers = []
    for i in range(3):
        data_dir = procs.workdir / f"broker-data-{i}"
        address = f"tcp://127.0.0.1:{free_port()}"
        args = [
            "broker",
            "start",
            "--data",
            str(data_dir),
            "--listen",
            address,
            "--zk",
            tc.hosts,
            "--cluster",
            tc.name,
            "--zk-session-timeout-s",
            "2.0",
            "--wait-for",
            "3",
        ]
        brokers.append(procs.start("broker", args, address=address, data_dir=data_dir))
    return bookies, brokers


def _submit(tc: ZkCluster, n: int) -> dict[str, str]:
    acked = {}
    with Client(zk=tc.hosts, cluster=tc.name, timeout=30) as client:
        for i in range(n):
            acked[f"k{i}"] = client.submit("survive", f"task {i}".encode(), key=f"k{i}")
    return acked


def _restart_bookies(procs, bookies) -> list:
    """Bookies may wait (for the brokers' decision) before they answer: do not wait for them."""
    return [procs.start(p.name, p.args, address=p.address, data_dir=p.data_dir) for p in bookies]


def _restart_brokers(procs, brokers) -> list:
    """Each waits for the other two (--wait-for 3) before it answers: do not wait for them."""
    return [procs.start(p.name, p.args, address=p.address, data_dir=p.data_dir) for p in brokers]


def _same_dir(reported: str, data_dir: Path) -> bool:
    return Path(reported).resolve() in (data_dir.resolve(), (data_dir / "state").resolve())


def _leader(tc: ZkCluster, zk, timeout: float = 90.0) -> dict:
    def read():
        try:
            return json.loads(zk.get(tc.paths.leader)[0])
        except Exception:
            return None

    return wait_for(read, timeout, "a leader")


def _assert_every_task(tc: ZkCluster, acked: dict[str, str]) -> None:
    with Client(zk=tc.hosts, cluster=tc.name, timeout=60) as client:
        for key, task_id in acked.items():
            task = client.get(task_id)
            assert task["id"] == task_id and task["payload"] == f"task {key[1:]}".encode(), task
        # The same key still names the same task: no duplicate on a retried submit.
        assert client.submit("survive", b"task 0", key="k0") == acked["k0"]


def _init(procs, tc: ZkCluster) -> None:
    result = procs.run(["cluster", "init", "--zk", tc.hosts, "--cluster", tc.name])
    assert result.returncode == 0, result.stderr.decode()


def test_orderly_shutdown_then_zookeeper_wiped_restores_every_task(procs, private_zk):
    tc = _cluster(private_zk)
    _init(procs, tc)
    bookies, brokers = _start(procs, tc)
    _leader(tc, private_zk.zk)
    acked = _submit(tc, TASKS)
    old_epoch = json.loads(private_zk.zk.get(tc.paths.epoch)[0])["epoch"]

    result = procs.run(["cluster", "shutdown", "--zk", tc.hosts, "--cluster", tc.name, "--json"], timeout=90)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    for proc in brokers:
        assert proc.wait(30) == 0
    for proc in bookies:
        assert proc.terminate() == 0
    statuses = [read_status(p.data_dir) for p in brokers]
    assert all(s.clean for s in statuses) and len({s.final_signature for s in statuses}) == 1
    old_cluster_id = statuses[0].cluster_id

    private_zk.wipe()
    _init(procs, tc)
    _restart_bookies(procs, bookies)
    restarted = _restart_brokers(procs, brokers)
    leader = _leader(tc, private_zk.zk)
    config = json.loads(private_zk.zk.get(tc.paths.config)[0])
    assert config["cluster_id"] == old_cluster_id  # the stores' cluster continues
    assert leader["epoch"] > old_epoch
    _assert_every_task(tc, acked)
    # Every store was clean with the same final signature: all kept, nothing downloaded.
    wait_for(
        lambda: all("restarts from the state this store kept" in p.output() for p in restarted),
        30,
        "every broker to keep its store",
    )
    assert not any("installing a snapshot" in p.output() for p in restarted)
    assert not any(list(p.data_dir.glob("state.before-init-*")) for p in brokers)


def test_zookeeper_wiped_after_a_dirty_stop_needs_mark_clean_of_the_newest_store(procs, private_zk):
    tc = _cluster(private_zk)
    _init(procs, tc)
    bookies, brokers = _start(procs, tc)
    _leader(tc, private_zk.zk)
    acked = _submit(tc, TASKS)
    leader_id = _leader(tc, private_zk.zk)["broker_id"]
    for proc in brokers + bookies:
        proc.kill()
    for proc in brokers + bookies:
        proc.wait(10)

    private_zk.wipe()
    _init(procs, tc)
    running_bookies = _restart_bookies(procs, bookies)
    restarted = _restart_brokers(procs, brokers)
    for proc in restarted:
        assert proc.wait(60) == 1
        assert "manual recovery needed" in proc.output(), proc.output()[-2000:]
    assert private_zk.zk.exists(tc.paths.init_decision) is None  # an abort is never recorded

    dirs = [str(p.data_dir) for p in brokers]
    inspect = procs.run(["store", "inspect", *dirs, "--json"])
    assert inspect.returncode == 0, inspect.stderr.decode()
    report = json.loads(inspect.stdout)
    newest = report["newest"]
    # The leader applied every acknowledged entry, so its store is among the newest; it also holds
    # the snapshot it took when it won, older than its state. Marking it is the harder case: the
    # other members must not install that snapshot (it predates the seed of the re-created log).
    positions = {row["path"]: row["position"] for row in report["stores"]}
    leader_dir = next(str(p.data_dir) for p in brokers if _broker_id(p.data_dir) == leader_id)
    leader_row = next(path for path in positions if _same_dir(path, Path(leader_dir)))
    if positions[leader_row] == positions[newest]:
        newest = leader_row
    marked = procs.run(["store", "mark-clean", newest, "--yes"])
    assert marked.returncode == 0, marked.stderr.decode()

    # Without bookies nobody can lead: the moved-aside members meet only what the survivor served
    # before (the old snapshot, if it took one) and must wait for a snapshot of the seed or later.
    # (Installing the old one and then winning the election once bookies came lost every task.)
    for proc in running_bookies:
        proc.kill()
    restarted = _restart_brokers(procs, brokers)
    joiners = [proc for proc, broker in zip(restarted, brokers) if not _same_dir(newest, broker.data_dir)]
    for proc in joiners:
        wait_for(
            lambda: "waiting for a" in proc.output() or "installed snapshot" in proc.output(),
            90,
            "a moved-aside member to look for a snapshot",
        )
        assert "installed snapshot" not in proc.output(), proc.output()[-3000:]
    _restart_bookies(procs, bookies)
    _leader(tc, private_zk.zk)
    _assert_every_task(tc, acked)
    # The other two stores were dirty: moved aside (kept for inspection), their state from a snapshot.
    for proc, broker in zip(restarted, brokers):
        if _same_dir(newest, broker.data_dir):
            assert not list(broker.data_dir.glob("state.before-init-*"))
        else:
            assert list(broker.data_dir.glob("state.before-init-*"))
            wait_for(
                lambda: "installed snapshot" in proc.output(),
                90,
                "the moved-aside member to install a snapshot",
            )
    assert all(p.alive() for p in restarted)


def _broker_id(data_dir: Path) -> int:
    return json.loads((data_dir / ".broker.meta").read_text())["broker_id"]


def test_an_empty_disk_started_first_takes_no_kept_broker_id(procs, private_zk):
    """One broker's disk was lost in the same total failure: as docs/operations.md says, it starts
    on an empty data dir with the others (first, here: ZooKeeper's next_id is 1 again)."""
    tc = _cluster(private_zk)
    _init(procs, tc)
    bookies, brokers = _start(procs, tc)
    _leader(tc, private_zk.zk)
    acked = _submit(tc, TASKS)
    result = procs.run(["cluster", "shutdown", "--zk", tc.hosts, "--cluster", tc.name], timeout=90)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    for proc in brokers:
        assert proc.wait(30) == 0
    for proc in bookies:
        assert proc.terminate() == 0
    ids = {p.data_dir: _broker_id(p.data_dir) for p in brokers}
    codes = {
        p.data_dir: json.loads((p.data_dir / ".broker.meta").read_text())["register_code"] for p in brokers
    }
    lost, kept = brokers[0], brokers[1:]
    shutil.rmtree(lost.data_dir)

    private_zk.wipe()
    _init(procs, tc)
    _restart_bookies(procs, bookies)
    empty = procs.start(lost.name, lost.args, address=lost.address, data_dir=lost.data_dir)
    wait_for(
        lambda: (
            private_zk.zk.exists(tc.paths.init_members) and private_zk.zk.get_children(tc.paths.init_members)
        ),
        30,
        "the empty broker to report itself",
    )
    # It waits for the kept ones before it takes an id.
    assert not private_zk.zk.exists(tc.paths.broker_ids) or not private_zk.zk.get_children(
        tc.paths.broker_ids
    )
    restarted = [procs.start(p.name, p.args, address=p.address, data_dir=p.data_dir) for p in kept]
    _leader(tc, private_zk.zk)
    _assert_every_task(tc, acked)
    for proc in kept:
        assert _broker_id(proc.data_dir) == ids[proc.data_dir]
        record = json.loads(private_zk.zk.get(tc.paths.broker_id(ids[proc.data_dir]))[0])
        assert record["register_code"] == codes[proc.data_dir]
    new_id = _broker_id(lost.data_dir)
    assert new_id not in {ids[p.data_dir] for p in kept}
    wait_for(lambda: "installed snapshot" in empty.output(), 90, "the empty broker to join by snapshot")
    assert all(p.alive() for p in [empty, *restarted])
    assert not any("belongs to another broker" in p.output() for p in [empty, *restarted])
