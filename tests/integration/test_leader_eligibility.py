"""Who may lead (docs/architecture.md, "Who may lead"): the in-sync set, learners, lagging joiners, admin elect,
and one live process per broker id. Real ZooKeeper, bookies and brokers."""

import json
import shutil
import threading
import time

import pytest

from broker.api.client import Client
from election.insync import read_insync
from election.live import live_brokers
from tests.support.harness import BrokerCluster, wait_for

pytestmark = pytest.mark.integration

LEARNER = ["--learner"]


def _insync(bc: BrokerCluster) -> set[int]:
    doc, _ = read_insync(bc.cluster.zk, bc.cluster.paths)
    return set(doc["members"]) if doc else set()


def _id_of(bc: BrokerCluster, proc) -> int:
    live = live_brokers(bc.cluster.zk, bc.cluster.paths)
    return next(i for i, info in live.items() if info.get("address") == proc.address)


def _cluster(cluster, procs, brokers: list[list[str]]) -> BrokerCluster:
    bookies = procs.start_bookies(cluster, 3, fsync=False)
    started = []
    for extra in brokers:
        started.append(procs.start_broker(cluster, extra=extra))
        if not started[-1].args.count("--learner"):
            BrokerCluster(cluster, procs, bookies, started).wait_leader()
    return BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=started)


def _fill(bc: BrokerCluster, n: int, queue: str = "q") -> set[str]:
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=30) as client:
        ids = set()
        for start in range(0, n, 200):
            ids.update(
                client.submit_many(
                    [
                        {"queue": queue, "payload": b"x", "key": f"k{i}"}
                        for i in range(start, min(n, start + 200))
                    ]
                )
            )
        return ids


def _admin(bc: BrokerCluster, *args: str):
    return bc.procs.run(["admin", *args, "--zk", bc.zk_hosts, "--cluster", bc.cluster.name], timeout=60)


@pytest.mark.timeout(90)
def test_insync_set_admin_views_and_learner_marks(cluster, procs):
    bc = _cluster(cluster, procs, [[], [], LEARNER])
    leader, follower, learner = (_id_of(bc, p) for p in bc.brokers)
    wait_for(lambda: _insync(bc) == {leader, follower}, 20, "the in-sync set of leader and follower")
    _fill(bc, 50)
    out = _admin(bc, "insync", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert set(report["members"]) == {leader, follower} and report["leader"] == leader
    rows = {row["id"]: row for row in report["brokers"]}
    assert rows[learner]["learner"] and not rows[learner]["in_sync"] and rows[follower]["in_sync"]
    epochs = json.loads(_admin(bc, "epochs", "--json").stdout)
    assert epochs[-1]["broker_id"] == leader and epochs[-1]["first_position"][1] == 0
    assert epochs[-1]["started_at"] > time.time() - 120
    status = procs.run(["status", "--zk", bc.zk_hosts, "--cluster", cluster.name])
    learner_line = next(
        line for line in status.stdout.decode().splitlines() if line.strip().startswith(str(learner))
    )
    assert "learner" in learner_line and "in-sync" not in learner_line
    # a stale leader's write of the set fails: the epoch it names is no longer the current one
    from election.insync import write_insync
    from election.leader import LostLeadership

    with pytest.raises(LostLeadership):
        write_insync(cluster.zk, cluster.paths, {99}, report["leader_epoch"] - 1)
    assert _insync(bc) == {leader, follower}


@pytest.mark.timeout(120)
def test_replaying_joiner_does_not_win_an_in_sync_follower_does(cluster, procs):
    lag = ["--max-lag-entries", "5"]
    bc = _cluster(cluster, procs, [lag, lag])
    leader_proc = bc.leader_proc()
    follower_proc = next(p for p in bc.brokers if p is not leader_proc)
    leader, follower = _id_of(bc, leader_proc), _id_of(bc, follower_proc)
    _fill(bc, 3000)

    def settled() -> bool:
        # The leader judges the set from the followers' live nodes (refreshed every 500 ms) against
        # its own position: only once the follower's shows that position, after the load, can it no
        # longer drop out for a stale lag.
        at = bc.status(leader_proc.address)["position"]
        live = live_brokers(cluster.zk, cluster.paths)
        return _insync(bc) == {leader, follower} and live[follower].get("position") == at

    wait_for(settled, 20, "the follower caught up and in the in-sync set")
    joiner = procs.start_broker(cluster, extra=lag)  # empty store: it replays the whole history
    joiner.pause()  # hold it mid-replay so it is surely behind when the leader dies
    try:
        joiner_id = _id_of(bc, joiner)
        assert joiner_id not in _insync(bc)
        killed_at = time.monotonic()
        leader_proc.kill()
    finally:
        joiner.resume()
    new = bc.wait_leader(timeout=30, not_id=leader)
    assert new["broker_id"] == follower
    with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=30) as client:
        client.submit("q", b"after")
    assert time.monotonic() - killed_at < 15  # the usual failover: session expiry plus a takeover
    assert "not standing for election" in joiner.output()


@pytest.mark.timeout(120)
def test_learner_never_leads_and_lagging_leaders_follow_the_switch(cluster, procs):
    def cluster_command(*args: str) -> None:
        done = procs.run(["cluster", *args, "--zk", cluster.hosts, "--cluster", cluster.name])
        assert done.returncode == 0, done.stderr.decode() + done.stdout.decode()

    # allow_lagging_leader is a cluster-wide task setting: off from the start, on by `cluster config set`.
    cluster_command("init", "--no-allow-lagging-leader")
    bc = _cluster(cluster, procs, [[], ["--learner"]])
    leader_proc, learner = bc.brokers
    _fill(bc, 20)
    wait_for(
        lambda: any(
            i.get("address") == learner.address for i in live_brokers(cluster.zk, cluster.paths).values()
        ),
        10,
        "the learner's live node",
    )
    cluster_command("enable-feature", "cluster_settings")
    first = bc.wait_leader()["broker_id"]
    leader_proc.kill()
    lagging = procs.start_broker(cluster)
    # Once the dead leader's session has expired and the new broker has looked at the rules,
    # nobody may lead (the rules themselves: test_insync_rules, standing: test_candidacy).
    wait_for(
        lambda: (
            first not in live_brokers(cluster.zk, cluster.paths)
            and "not standing for election" in lagging.output()
        ),
        30,
        "the old leader's session to expire and the new broker to stay out",
    )
    assert bc.leader_info() is None
    # With no leader to log the change, the config node's value is what the standing rules read.
    cluster_command("config", "set", "allow_lagging_leader", "true")
    new = bc.wait_leader(timeout=30, not_id=first)
    assert new["address"] == lagging.address
    with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=30) as client:
        assert sum(client.status()["queues"]["q"].values()) == 20  # the lagging winner caught up first
    assert bc.leader_info()["address"] != learner.address


@pytest.mark.timeout(150)
def test_admin_elect_moves_leadership_under_keyed_load_and_refuses(cluster, procs):
    bc = _cluster(cluster, procs, [[], [], LEARNER])
    leader_proc = bc.leader_proc()
    target_proc = next(p for p in bc.brokers[:2] if p is not leader_proc)
    leader, target, learner = _id_of(bc, leader_proc), _id_of(bc, target_proc), _id_of(bc, bc.brokers[2])
    wait_for(lambda: _insync(bc) == {leader, target}, 20, "the in-sync set")
    acked, errors, stop = set(), [], threading.Event()

    def load():
        with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=30, request_timeout=1.0) as client:
            n = 0
            while not stop.is_set():
                try:
                    acked.update(
                        client.submit_many(
                            [{"queue": "keyed", "payload": b"x", "key": f"e{n + i}"} for i in range(10)]
                        )
                    )
                except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                    errors.append(repr(exc))
                n += 10

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(acked) >= 50, 30, "the load to run")
        for refused, reason in ((learner, "learner"), (987, "no broker with id 987")):
            out = _admin(bc, "elect", str(refused))
            assert out.returncode == 1 and reason in out.stderr.decode(), out.stderr
            assert b"Traceback" not in out.stderr
        started = time.monotonic()
        out = _admin(bc, "elect", str(target))
        assert out.returncode == 0, out.stderr
        assert bc.leader_info()["broker_id"] == target
        assert time.monotonic() - started < 10
        before = len(acked)
        wait_for(lambda: len(acked) >= before + 50, 30, "the load to go on with the new leader")
    finally:
        stop.set()
        thread.join(30)
    assert not errors
    with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=30) as client:
        depth = client.status()["queues"]["keyed"]
        assert sum(v for k, v in depth.items() if k != "delayed") == len(acked)  # none lost, none twice
    # a lagging broker (out of the set) is refused with the reason
    # A long session: paused, it must stay alive (only lagging) however long the machine takes to notice.
    lagging = procs.start_broker(cluster, session_timeout=30.0, extra=["--max-lag-entries", "0"])
    lagging_id = _id_of(bc, lagging)
    lagging.pause()
    try:
        wait_for(lambda: lagging_id not in _insync(bc), 20, "the paused broker out of the set")
        out = _admin(bc, "elect", str(lagging_id))
    finally:
        lagging.resume()
    assert out.returncode == 1 and "lagging" in out.stderr.decode(), out.stderr


@pytest.mark.timeout(90)
def test_a_copy_of_a_live_brokers_data_dir_is_refused(cluster, procs, tmp_path, free_port):
    bc = _cluster(cluster, procs, [[]])
    original = bc.brokers[0]
    original_id = _id_of(bc, original)
    copy = tmp_path / "copied-broker"
    shutil.copytree(original.data_dir, copy, ignore=shutil.ignore_patterns("*.lock", "lock"))
    out = procs.run(
        [
            "broker",
            "start",
            "--data",
            str(copy),
            "--listen",
            f"tcp://127.0.0.1:{free_port()}",
            "--zk",
            bc.zk_hosts,
            "--cluster",
            cluster.name,
            "--zk-session-timeout-s",
            "2",
        ],
        timeout=60,
    )
    err = out.stderr.decode()
    assert out.returncode == 1, err
    assert f"broker id {original_id} is already live at {original.address}" in err
    assert ".broker.meta" in err and "Traceback" not in err
    assert live_brokers(cluster.zk, cluster.paths)[original_id]["address"] == original.address
    assert original.alive()
