"""Broker stores that verify themselves and know their cluster, on real processes."""

import json
import os
import uuid
from pathlib import Path

import lmdb
import pytest

from broker.state.events import event
from broker.state.schema import META_CLUSTER
from broker.state.store import StateStore
from election.cluster_config import ClusterOptions, ensure_cluster_config
from election.identity import META
from ledger.log import write_log
from tests.support.harness import BrokerCluster, call, wait_for
from tests.support.store_damage import flip_payload_byte

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

FAST_CHECKPOINTS = ["--checkpoint-entries", "5"]


def start(cluster, procs, extra=FAST_CHECKPOINTS):
    bookies = procs.start_bookies(cluster, 3)
    brokers = procs.start_brokers(cluster, 2, extra=extra)
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
    bc.wait_leader()
    return bc


def finished_task(address: str, payload: bytes) -> str:
    """Submit, lease and complete one task; its id."""
    task_id = call(address, "submit", queue="q", payload=payload, key="marked")["task_id"]
    [lease] = call(address, "lease", worker="w", queues=["q"], max_tasks=1)["tasks"]
    assert lease["task_id"] == task_id
    assert call(address, "complete", task_id=task_id, attempt=lease["attempt"], result=b"ok")["ok"]
    return task_id


def submit_some(address: str, n: int, prefix: str) -> None:
    for i in range(n):
        assert call(address, "submit", queue="other", payload=b"x", key=f"{prefix}{i}")["ok"]


def nudge(address: str, n: int, prefix: str) -> None:
    """Writes that bring on the next checkpoint; the broker may already have found the damage
    and stopped accepting them, which is what the test waits for next."""
    for i in range(n):
        if not call(address, "submit", queue="other", payload=b"x", key=f"{prefix}{i}")["ok"]:
            return


def caught_up(bc, proc):
    leader = call(bc.wait_leader()["address"], "status")
    mine = call(proc.address, "status")
    return mine if (mine["position"], mine["digest"]) == (leader["position"], leader["digest"]) else None


def setup_damaged_follower(cluster, procs, kill: bool):
    """A cluster whose follower holds a finished task whose payload byte was flipped while it was down."""
    bc = start(cluster, procs)
    leader = bc.leader_proc()
    follower = next(p for p in bc.brokers if p is not leader)
    marker = b"MARKER-" + uuid.uuid4().hex.encode()
    payload = marker * 100  # big enough for its own overflow page
    task_id = finished_task(leader.address, payload)
    submit_some(leader.address, 12, "a")  # a few checkpoints, all of sound state
    wait_for(lambda: caught_up(bc, follower), 30, "the follower to catch up")
    if kill:
        follower.kill()
    else:
        assert follower.terminate() == 0
    sound = procs.run(["store", "verify", str(follower.data_dir)])
    assert sound.returncode == 0, sound.stderr.decode()
    assert flip_payload_byte(follower.data_dir, marker) >= 1
    damaged = procs.run(["store", "verify", "--json", str(follower.data_dir)])
    assert damaged.returncode == 1 and json.loads(damaged.stdout)["ok"] is False
    reason = damaged.stderr.decode().strip().splitlines()
    assert len(reason) == 1 and "damaged" in reason[0] and "Traceback" not in damaged.stderr.decode()
    return bc, leader, follower, task_id, payload


def assert_rebuilt(data_dir: Path, output: str) -> None:
    critical = [line for line in output.splitlines() if "CRITICAL" in line]
    assert len(critical) == 1 and "damaged" in critical[0], critical
    assert list(Path(data_dir).glob("state.damaged-*")), "the damaged copy was not kept aside"
    assert "Traceback" not in output


def test_flipped_payload_byte_is_found_after_the_start_and_the_store_rebuilt(cluster, procs):
    bc, leader, follower, task_id, payload = setup_damaged_follower(cluster, procs, kill=False)
    # Closed in order: not verified as it opens, but checked in the background after its start.
    follower = procs.restart(follower)
    bc.brokers = [leader, follower]
    submit_some(leader.address, 12, "b")  # writes meanwhile, which the rebuilt store must reach
    wait_for(lambda: "rebuilt the state store" in follower.output(), 60, "the follower to rebuild its store")
    output = follower.output()
    assert 0 <= output.find("verifying the state store after its start") < output.find("CRITICAL")
    wait_for(lambda: caught_up(bc, follower), 60, "the rebuilt follower to reach the leader's digest")
    assert_rebuilt(follower.data_dir, follower.output())
    # Now let it lead: it must serve the payload that was acknowledged, not the damaged one.
    assert leader.terminate() == 0
    wait_for(lambda: (bc.leader_info() or {}).get("address") == follower.address, 30, "the follower to lead")
    got = wait_for(
        lambda: call(follower.address, "get", task_id=task_id).get("task"), 30, "get from the new leader"
    )
    assert got["payload"] == payload and got["state"] == "done"


def test_flipped_payload_byte_after_an_unclean_stop_is_found_at_start(cluster, procs):
    bc, leader, follower, task_id, payload = setup_damaged_follower(cluster, procs, kill=True)
    follower = procs.restart(follower)
    bc.brokers = [leader, follower]
    submit_some(leader.address, 3, "b")
    state = wait_for(lambda: caught_up(bc, follower), 60, "the rebuilt follower to reach the leader's digest")
    output = follower.output()
    assert "not closed in order: verifying" in output
    assert_rebuilt(follower.data_dir, output)
    assert follower.terminate() == 0
    with StateStore(Path(follower.data_dir) / "state", readonly=True) as store:
        assert store.get_task(task_id)["payload"] == payload
        assert store.digest() == state["digest"] == store.verify()["digest"]


def _foreign_store(data_dir: Path, cluster_id: str | None, position=(0, 0)) -> None:
    with StateStore(data_dir / "state", map_size=64 << 20) as store:
        store.apply_batch(
            [
                event("EpochStarted", epoch=1, broker_id=1, now_ms=1),
                event("TaskSubmitted", task_id="t1", queue="q", payload=b"theirs", now_ms=2),
            ],
            position,
        )
        if cluster_id:
            store.set_cluster_id(cluster_id)


@pytest.mark.parametrize(
    "foreign_id, expect",
    [
        ("0b9e4c9e-another-cluster", "belongs to cluster 0b9e4c9e-another-cluster"),
        (None, "beyond the cluster's log"),
    ],
)
def test_a_foreign_state_dir_without_broker_meta_is_refused(cluster, procs, tmp_path, foreign_id, expect):
    config = ensure_cluster_config(cluster.zk, cluster.paths, ClusterOptions(), clock=lambda: 1.0)
    # An active cluster (its log has a ledger): a cluster without one decides by the join rules instead.
    write_log(cluster.zk, cluster.paths, [{"id": 0, "epoch": 1}], expected_version=-1, claim=None)
    data = tmp_path / "foreign"
    _foreign_store(data, foreign_id, position=(5, 0))
    assert not (data / META).exists()
    result = procs.run(
        [
            "broker",
            "start",
            "--data",
            str(data),
            "--listen",
            "tcp://127.0.0.1:1",
            "--zk",
            cluster.hosts,
            "--cluster",
            cluster.name,
        ],
        timeout=60,
    )
    err = result.stderr.decode()
    assert result.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("fencepost: wrong store") and expect in last and config["cluster_id"] in last, last
    assert "Traceback" not in err
    assert not (data / META).exists() and not cluster.zk.exists(cluster.paths.broker_id(1))


@pytest.mark.parametrize(
    "content, field",
    [
        ('{"cluster": "%s", "name": "b", "broker_id": "one", "register_code": "c"}', "broker_id"),
        ('{"cluster": "%s", "name": "b", "broker_id": 1', "valid JSON"),
    ],
)
def test_a_damaged_broker_meta_stops_the_broker_with_one_line(cluster, procs, tmp_path, content, field):
    data = tmp_path / "b"
    data.mkdir()
    (data / META).write_text(content % cluster.name if "%s" in content else content)
    result = procs.run(
        [
            "broker",
            "start",
            "--data",
            str(data),
            "--listen",
            "tcp://127.0.0.1:1",
            "--zk",
            cluster.hosts,
            "--cluster",
            cluster.name,
        ],
        timeout=60,
    )
    err = result.stderr.decode()
    last = err.strip().splitlines()[-1]
    assert result.returncode == 1 and "Traceback" not in err
    assert last.startswith("fencepost: ") and str(data / META) in last and field in last, last


def test_a_store_without_cluster_id_consistent_with_the_log_is_adopted(cluster, procs):
    bc = start(cluster, procs, extra=[])
    leader = bc.leader_proc()
    follower = next(p for p in bc.brokers if p is not leader)
    submit_some(leader.address, 5, "c")
    wait_for(lambda: caught_up(bc, follower), 30, "the follower to catch up")
    assert follower.terminate() == 0
    env = lmdb.open(str(Path(follower.data_dir) / "state"), max_dbs=16, map_size=1 << 30)
    with env.begin(write=True) as txn:  # as a store made before cluster ids were recorded
        assert txn.delete(META_CLUSTER, db=env.open_db(b"meta", txn=txn))
    env.close()
    follower = procs.restart(follower)
    bc.brokers = [leader, follower]
    wait_for(lambda: "adopting cluster" in follower.output(), 30, "the adoption line")
    assert follower.terminate() == 0
    report = json.loads(procs.run(["store", "verify", "--json", str(follower.data_dir)]).stdout)
    config = json.loads(cluster.zk.get(cluster.paths.config)[0])
    assert report["cluster_id"] == config["cluster_id"]


def test_a_leader_whose_store_is_damaged_while_it_runs_hands_over_and_rebuilds(cluster, procs):
    bc = start(cluster, procs)
    leader = bc.leader_proc()
    follower = next(p for p in bc.brokers if p is not leader)
    marker = b"MARKER-" + uuid.uuid4().hex.encode()
    payload = marker * 100
    task_id = finished_task(leader.address, payload)
    submit_some(leader.address, 12, "a")
    # Damage the running leader's file in place: LMDB maps it, so its next read sees the flip.
    path = Path(leader.data_dir) / "state" / "data.mdb"
    fd = os.open(path, os.O_RDWR)
    try:
        data = path.read_bytes()
        at = data.find(marker)
        while at >= 0:
            os.pwrite(fd, bytes([data[at + 20] ^ 0x20]), at + 20)
            at = data.find(marker, at + 1)
        os.fsync(fd)
    finally:
        os.close(fd)
    nudge(leader.address, 8, "b")  # its next checkpoint reads the damaged payload
    wait_for(
        lambda: "rebuilt the state store" in leader.output(), 60, "the leader to find the damage and rebuild"
    )
    new = bc.wait_leader(timeout=30)
    assert new["address"] == follower.address, "a broker rebuilding its store must not lead"
    got = wait_for(
        lambda: call(follower.address, "get", task_id=task_id).get("task"), 30, "get from the new leader"
    )
    assert got["payload"] == payload
    wait_for(lambda: caught_up(bc, leader), 60, "the rebuilt broker to reach the new leader's digest")
    assert_rebuilt(leader.data_dir, leader.output())


def test_a_torn_or_rolled_back_store_after_a_machine_crash_loses_no_acknowledged_task(cluster, procs):
    """The state store is not fsynced per entry: a machine crash may leave its file torn (some
    pages new, some old) or rolled back. Simulated on a SIGKILLed leader's data.mdb, with its
    in-use marker naming another boot: restarted, the broker checks the store in a child process
    (LMDB aborts on a torn tree), rebuilds a torn one, catches a rolled-back one up, and every
    acknowledged task is there."""
    from broker.api.client import Client

    bc = start(cluster, procs, extra=[])
    with Client(zk=cluster.hosts, cluster=cluster.name, timeout=30) as client:
        acked = {f"a{i}": client.submit("q", b"early", key=f"a{i}") for i in range(30)}
        old, old_id = bc.leader_proc(), bc.leader_info()["broker_id"]
        path = Path(old.data_dir) / "state" / "data.mdb"
        early = path.read_bytes()  # what the disk may still hold of the file after a crash
        acked.update({f"b{i}": client.submit("q", b"late" * 50, key=f"b{i}") for i in range(300)})
    assert bc.leader_proc() is old
    survivor = next(p for p in bc.brokers if p is not old)
    old.kill()
    late = path.read_bytes()
    page = 4096
    torn = bytearray(late)
    # Meta pages from the end, every other page of the tree from the beginning.
    for at in range(2 * page, min(len(early), len(late)), 2 * page):
        torn[at : at + page] = early[at : at + page]
    assert bytes(torn) != late
    bc.wait_leader(not_id=old_id)  # the survivor leads: the restarted broker follows it
    for image, expect_rebuild in ((bytes(torn), True), (early, False)):
        path.write_bytes(image)
        # As after a reboot: the in-use marker names another boot of the machine.
        (Path(old.data_dir) / "state.inuse").write_text(json.dumps({"boot_id": "a-previous-boot"}))
        old = procs.restart(old)
        bc.brokers = [survivor, old]
        wait_for(lambda: caught_up(bc, old), 60, "the restarted broker to reach the leader's digest")
        output = old.output()
        assert "the machine went down while the state store was open" in output
        if expect_rebuild:
            assert_rebuilt(old.data_dir, output)
        else:
            assert "survived the machine crash" in output and "not closed in order: verifying" in output
        old.kill()
    old = procs.restart(old)
    bc.brokers = [survivor, old]
    wait_for(lambda: caught_up(bc, old), 60, "the restarted broker to catch up")
    assert survivor.terminate() == 0
    wait_for(lambda: (bc.leader_info() or {}).get("broker_id") == old_id, 30, "the restarted broker to lead")
    with Client(zk=cluster.hosts, cluster=cluster.name, timeout=30) as client:
        for key, task_id in acked.items():
            assert client.get(task_id)["id"] == task_id, key
