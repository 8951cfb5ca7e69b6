"""Checkpoints, retention and joining with real brokers, bookies and ZooKeeper."""

import json
import re
import time
from pathlib import Path

import pytest

from ledger.log import read_log
from tests.support.harness import BrokerCluster, call, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SMALL = ["--ledger-max-entries", "10", "--checkpoint-entries", "15", "--retention-s", "0"]


def start(cluster, procs, brokers=2, extra=SMALL):
    bookies = procs.start_bookies(cluster, 3)
    started = procs.start_brokers(cluster, brokers, extra=extra)
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=started)
    bc.wait_leader()
    return bc


def submit_many(bc, n, prefix):
    leader = bc.wait_leader()["address"]
    for i in range(n):
        reply = call(leader, "submit", queue="snap", payload=b"%d" % i, key=f"{prefix}{i}")
        assert reply["ok"], reply


def caught_up(bc, proc):
    leader = call(bc.wait_leader()["address"], "status")
    mine = call(proc.address, "status")
    return mine if mine["position"] == leader["position"] and mine["digest"] == leader["digest"] else None


def test_new_broker_joins_by_snapshot_after_early_ledgers_were_deleted(cluster, procs):
    bc = start(cluster, procs)
    submit_many(bc, 120, "a")
    wait_for(
        lambda: read_log(cluster.zk, cluster.paths)[0][0]["id"] > 2, 60, "retention to delete early ledgers"
    )
    joiner = procs.start_broker(cluster, extra=SMALL)
    bc.brokers.append(joiner)
    submit_many(bc, 10, "b")
    state = wait_for(lambda: caught_up(bc, joiner), 60, "the joiner to reach the leader's digest")
    assert state["queues"]["snap"]["waiting"] == 130
    assert "installed snapshot" in joiner.output()


def test_retention_keeps_ledgers_that_no_snapshot_covers(cluster, procs):
    bc = start(
        cluster,
        procs,
        extra=[
            "--ledger-max-entries",
            "10",
            "--checkpoint-entries",
            "100000",
            "--checkpoint-s",
            "100000",
            "--retention-s",
            "0",
        ],
    )
    submit_many(bc, 60, "c")
    time.sleep(6)  # more than one retention pass
    ledgers, _ = read_log(cluster.zk, cluster.paths)
    assert ledgers[0]["id"] == 0, "a ledger was deleted although no snapshot covers it"
    assert len(ledgers) >= 5


def test_broker_killed_while_writing_snapshots_restarts_intact(cluster, procs):
    import os
    import threading

    bc = start(cluster, procs, extra=["--checkpoint-entries", "1", "--snapshots-kept", "2"])
    leader = bc.wait_leader()["address"]
    for i in range(150):  # incompressible payloads, so that writing a snapshot takes a while
        assert call(leader, "submit", queue="snap", payload=os.urandom(20_000), key=f"big{i}")["ok"]
    victim = next(p for p in bc.brokers if p.address != leader)
    snapdir = Path(victim.data_dir) / "snapshots"
    stop = threading.Event()

    def trickle():  # a new entry now and then, so the victim checkpoints every second
        n = 0
        while not stop.is_set():
            call(leader, "submit", queue="snap", payload=b"t", key=f"t{n}")
            n += 1
            time.sleep(0.2)

    feeder = threading.Thread(target=trickle, daemon=True)
    feeder.start()
    try:
        wait_for(lambda: list(snapdir.glob("*.fps")), 30, "the victim's first complete snapshot")
        for _ in range(3):
            deadline = time.monotonic() + 30
            while not list(snapdir.glob("*.tmp")) and time.monotonic() < deadline:
                time.sleep(0.001)
            assert list(snapdir.glob("*.tmp")), "never saw a snapshot being written"
            victim.kill()
            victim = procs.restart(victim)
            bc.brokers = [p for p in bc.brokers if p.alive()] + [victim]
            wait_for(lambda: caught_up(bc, victim), 60, "the restarted broker to catch up")
    finally:
        stop.set()
        feeder.join(10)
    wait_for(lambda: caught_up(bc, victim), 60, "the restarted broker to catch up")
    listing = procs.run(["snapshot", "list", "--data", str(victim.data_dir), "--json"])
    assert listing.returncode == 0, listing.stderr.decode()
    rows = json.loads(listing.stdout)
    assert rows and not [r for r in rows if r.get("error")], rows
    verified = 0
    for row in rows:
        result = procs.run(["snapshot", "verify", row["path"]])
        if result.returncode == 2 and not Path(row["path"]).exists():
            continue  # retention removed it after the listing: the broker keeps checkpointing
        assert result.returncode == 0, result.stderr.decode()
        verified += 1
    assert verified, "every listed snapshot vanished before it could be verified"


def test_damaged_or_foreign_snapshots_are_refused_with_a_reason(cluster, procs, tmp_path):
    bc = start(cluster, procs, brokers=1)
    submit_many(bc, 20, "f")
    data = bc.brokers[0].data_dir
    target = ["--zk", cluster.hosts, "--cluster", cluster.name]
    made = procs.run(["snapshot", "create", "--data", str(data), *target])
    assert made.returncode == 0, made.stderr.decode()
    path = Path(made.stdout.decode().split(":")[0])
    good = path.read_bytes()
    flipped = tmp_path / path.name
    middle = len(good) // 2
    flipped.write_bytes(good[:middle] + bytes([good[middle] ^ 0x40]) + good[middle + 1 :])
    truncated = tmp_path / ("t-" + path.name)
    truncated.write_bytes(good[: len(good) // 2])
    for bad, reasons in ((flipped, ("crc", "checksum")), (truncated, ("truncated",))):
        result = procs.run(["snapshot", "verify", str(bad)])
        err = result.stderr.decode().lower()
        assert result.returncode == 1 and any(r in err for r in reasons), err
    foreign = procs.run(["snapshot", "verify", str(path), "--cluster-id", "another-cluster"])
    assert foreign.returncode == 1 and "cluster" in foreign.stderr.decode()
    restore = procs.run(
        [
            "snapshot",
            "restore",
            str(path),
            "--data",
            str(tmp_path / "fresh"),
            "--zk",
            cluster.hosts,
            "--cluster",
            "someothercluster",
        ]
    )
    assert restore.returncode == 1
    in_use = procs.run(["snapshot", "restore", str(path), "--data", str(data), *target])
    assert in_use.returncode == 1 and "in use" in in_use.stderr.decode()
    ok = procs.run(["snapshot", "restore", str(path), "--data", str(tmp_path / "fresh"), *target])
    assert ok.returncode == 0, ok.stderr.decode()


def test_join_falls_back_to_another_source_when_a_snapshot_is_damaged(cluster, procs):
    extra = ["--checkpoint-entries", "5", "--ledger-max-entries", "5", "--retention-s", "0"]
    bc = start(cluster, procs, extra=extra)
    submit_many(bc, 20, "g")
    wait_for(lambda: cluster.zk.exists(cluster.paths.log_start), 30, "retention to delete early ledgers")

    def advertised():
        infos = [
            json.loads(cluster.zk.get(cluster.paths.live_broker(int(c)))[0])
            for c in cluster.zk.get_children(cluster.paths.live_brokers)
        ]
        return infos if len(infos) == 2 and all(i.get("snapshot") for i in infos) else None

    wait_for(advertised, 30, "both brokers to advertise a snapshot")
    time.sleep(1.5)  # let the last checkpoints settle: no new entries, so no new snapshots
    latest = json.loads(cluster.zk.get(cluster.paths.snapshots_latest)[0])
    damaged = next(
        p
        for p in bc.brokers
        if json.loads((Path(p.data_dir) / ".broker.meta").read_text())["broker_id"] == latest["broker_id"]
    )
    for path in (Path(damaged.data_dir) / "snapshots").glob("*.fps"):
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        path.write_bytes(bytes(raw))
    joiner = procs.start_broker(cluster, extra=extra)
    bc.brokers.append(joiner)
    state = wait_for(lambda: caught_up(bc, joiner), 60, "the joiner to catch up from the undamaged source")
    assert state["queues"]["snap"]["waiting"] == 20
    out = joiner.output()
    assert f"snapshot from broker {latest['broker_id']} failed" in out and "installed snapshot" in out


QUIET = ["--ledger-max-entries", "10", "--checkpoint-entries", "100000", "--checkpoint-s", "100000"]


def _broker_id(proc) -> int:
    return json.loads((Path(proc.data_dir) / ".broker.meta").read_text())["broker_id"]


def _advertised(cluster, proc):
    node = cluster.paths.live_broker(_broker_id(proc))
    return (json.loads(cluster.zk.get(node)[0]).get("snapshot") if cluster.zk.exists(node) else None) or None


def _installed_at(output: str) -> list[tuple[int, int]]:
    return [
        tuple(json.loads("[" + m + "]")) for m in re.findall(r"installed snapshot at \(([-\d, ]+)\)", output)
    ]


def _status(procs, cluster) -> dict:
    result = procs.run(["status", "--zk", cluster.hosts, "--cluster", cluster.name, "--json"])
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def test_joiner_takes_a_snapshot_that_covers_the_log_start_and_waits_while_none_does(cluster, procs):
    bc = start(cluster, procs, brokers=1)
    leader = bc.brokers[0]
    # A learner that checkpoints only when it stops in order: its snapshot stays where it stopped.
    learner = procs.start_broker(cluster, extra=[*QUIET, "--learner"])
    submit_many(bc, 20, "a")
    wait_for(lambda: caught_up(bc, learner), 60, "the learner to catch up")
    assert learner.terminate() == 0
    learner = procs.restart(learner)
    old = wait_for(lambda: _advertised(cluster, learner), 30, "the learner to advertise its snapshot")
    submit_many(bc, 120, "b")
    wait_for(
        lambda: read_log(cluster.zk, cluster.paths)[0][0]["id"] > old["position"][0],
        60,
        "retention to delete the ledger of the learner's snapshot",
    )
    # `snapshots/latest` names the old snapshot, so it is the first source a joiner sees.
    cluster.zk.set(
        cluster.paths.snapshots_latest, json.dumps({"broker_id": _broker_id(learner), **old}).encode()
    )
    joiner = procs.start_broker(cluster, extra=QUIET)
    bc.brokers.append(joiner)
    wait_for(lambda: caught_up(bc, joiner), 60, "the joiner to reach the leader's digest")
    first = read_log(cluster.zk, cluster.paths)[0][0]["id"]
    installed = _installed_at(joiner.output())
    assert len(installed) == 1 and installed[0][0] >= first, (installed, first)
    assert "no longer in the log" not in joiner.output()

    # Only the old snapshot is served now: a new joiner waits, saying why, and installs nothing.
    assert joiner.terminate() == 0 and leader.terminate() == 0
    bc.brokers = [learner]
    waiting = procs.start_broker(cluster, extra=QUIET, ready=False)
    notice = wait_for(lambda: _status(procs, cluster)["joining"], 60, "status to show the joiner's wait")
    assert "covers the log start" in notice[0]["reason"], notice
    assert f"broker {_broker_id(learner)}'s at {tuple(old['position'])}" in notice[0]["reason"]
    human = procs.run(["status", "--zk", cluster.hosts, "--cluster", cluster.name])
    assert "not joined yet: waiting for a snapshot that covers the log start" in human.stdout.decode()
    time.sleep(3)
    assert not _installed_at(waiting.output()) and waiting.alive()

    # A broker serving a snapshot past the log start comes back: the joiner takes that one.
    leader = procs.restart(leader)
    bc.brokers = [leader, learner, waiting]
    procs.wait_ready([waiting], timeout=90)
    wait_for(lambda: caught_up(bc, waiting), 60, "the waiting joiner to reach the leader's digest")
    installed = _installed_at(waiting.output())
    assert len(installed) == 1 and installed[0][0] >= first, installed
    assert not cluster.zk.get_children(cluster.paths.snapshot_joiners)
