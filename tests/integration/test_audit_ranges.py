"""The audit in parallel on a real cluster (3 bookies, 2 brokers, Spark in local mode).

- Snapshots cut the history into ranges, each replayed on its own: a clean history is clean range by
  range; a snapshot whose state was altered (and its digest made to match) is named with the range
  before it, and the range it starts is named by its snapshot range at its first ``StateDigest``,
  while the ranges around stay clean.
- A history spanning the ``event_outcomes`` flag audits clean (the part before the flag by the
  replay's decisions, the rest by the ``Outcomes``), as the audit of the same rows replayed in one
  piece does; then a completion the log's ``Outcomes`` make stale, written as a leader would
  (an epoch of entries straight to the ledgers), is found, and a late completion apply refused is not.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from broker.admin.snapshots import create_snapshot
from broker.api.client import Client
from broker.state.events import decode_batch, encode_batch, event
from broker.state.outcomes import FLAG, decisions, outcome_events
from broker.state.schema import META_LOCAL
from broker.state.store import StateStore
from election.cluster_config import read_cluster_config
from election.features import enable
from ledger.client.facade import LedgerClient
from ledger.log import append_ledger, read_log
from pipeline.audit import audit_cluster, audit_export
from pipeline.history import cluster_entries
from pipeline.plan import ClusterAddress
from pipeline.rows import SCHEMA, entry_rows, format_position
from snapshots.reader import iter_records, read_header
from snapshots.writer import write_snapshot
from tests.support.harness import BrokerCluster, call, wait_for
from tests.support.pipeline_runs import work

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

KEPT = b"kept-payload-0123456789"


@pytest.fixture
def digesting_cluster(cluster, procs):
    """Three bookies and two brokers whose leader writes a StateDigest every 3 entries."""
    bookies = procs.start_bookies(cluster, 3)
    brokers = procs.start_brokers(cluster, 2, extra=["--digest-every-entries", "3"])
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
    bc.wait_leader()
    return bc


def _round(bc, client, tag: str) -> None:
    for i in range(10):
        client.submit(
            "jobs", b"bad" if i % 4 == 0 else f"{tag} {i}".encode(), key=f"{tag}{i}", max_attempts=2
        )
    work(bc, ["jobs"], client)


def _snapshot(bc, out) -> dict:
    """A snapshot of the leader's store now, copied out of its data dir (the broker prunes its own)."""
    cluster_id = read_cluster_config(bc.cluster.zk, bc.cluster.paths)["cluster_id"]
    header = create_snapshot(bc.leader_proc().data_dir, cluster_id)
    path = out / Path(header["path"]).name
    shutil.copyfile(header["path"], path)
    return {**header, "path": str(path)}


def _digest_positions(address) -> list[tuple[int, int]]:
    return [
        (ledger_id, entry_id)
        for ledger_id, entry_id, _, payload in cluster_entries(address)
        if any(ev["type"] == "StateDigest" for ev in decode_batch(payload))
    ]


def _altered(snapshot: dict, out) -> str:
    """The snapshot with one byte of a waiting task's payload changed and its digest made to match: it
    loads, but its state is not the history's."""
    records = [
        (db, key, value.replace(KEPT, KEPT[:-1] + b"X"))
        for db, key, value in iter_records(snapshot["path"])
        if not (db == "meta" and bytes(key) in META_LOCAL)  # the digest it claims, which no longer holds
    ]
    assert any(KEPT[:-1] + b"X" in value for _, _, value in records), "the kept task is not in the snapshot"
    header = read_header(snapshot["path"])
    with StateStore(out / "altered-state", sync=False) as store:
        digest = store.load_records(iter(records), cluster_id=header["cluster_id"])
    keys = ("cluster_id", "broker_id", "position", "epoch", "created_at")
    path = out / "altered.fps"
    write_snapshot(path, {**{k: header[k] for k in keys}, "digest": digest}, records)
    return str(path)


def test_ranges_between_snapshots_replay_apart_and_an_altered_one_is_named_by_its_range(
    spark, digesting_cluster, tmp_path
):
    bc = digesting_cluster
    address = ClusterAddress(bc.zk_hosts, bc.cluster.name)
    snaps = []
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
        client.submit("kept", KEPT)  # no worker leases it: it waits in every snapshot
        for tag in ("a", "b", "c", "d"):
            _round(bc, client, tag)
            if tag != "d":
                snaps.append(_snapshot(bc, tmp_path))
    for broker in bc.brokers:  # nothing more is written: every audit reads the same history
        broker.terminate()
    positions = [tuple(s["position"]) for s in snaps]
    assert positions == sorted(set(positions)), positions

    report = audit_cluster(spark, address, snapshot=[s["path"] for s in snaps])
    doc = report.summary()
    assert report.findings == [], doc["findings"]
    ranges = doc["shards"][0]["ranges"]
    end = format_position(report.replay.last)
    assert [(r["from"], r["to"]) for r in ranges] == list(
        zip([None, *map(format_position, positions)], [*map(format_position, positions), end])
    )
    assert all(r["state_digests"] > 0 and r["error"] is None for r in ranges), ranges
    assert doc["state_digests"]["compared"] == len(_digest_positions(address))
    assert doc["replay"]["grants"] >= 40 and doc["shards"][0]["tasks_checked"] == "all"

    # The middle snapshot altered: the range before it reaches another state there, and the range it
    # starts disagrees with its first StateDigest; the first and last ranges are clean.
    altered = _altered(snaps[1], tmp_path)
    report = audit_cluster(spark, address, snapshot=[snaps[0]["path"], altered, snaps[2]["path"]])
    first_digest = next(p for p in _digest_positions(address) if p > positions[1])
    found = [(f.kind, f.shard, f.ledger, f.entry) for f in report.findings]
    assert found == [("digest_mismatch", 0, *positions[1]), ("digest_mismatch", 0, *first_digest)], found
    before, inside = report.findings
    p0, p1, p2 = map(format_position, positions)
    assert f"the replay of range snapshot {p0} .. {p1} reaches" in before.detail and altered in before.detail
    assert f"(range snapshot {p1} .. {p2}; its replay stops here)" in inside.detail
    ranges = report.summary()["shards"][0]["ranges"]
    assert [r["state_digests"] > 0 for r in ranges] == [True, True, True, True]
    assert report.summary()["shards"][0]["tasks_checked"] == p1


def _write_export(address, out) -> None:
    by_epoch: dict[int, list] = {}
    for ledger_id, entry_id, epoch, payload in cluster_entries(address):
        by_epoch.setdefault(epoch, []).extend(entry_rows(ledger_id, entry_id, epoch, payload))
    for epoch, rows in by_epoch.items():
        table = pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows], schema=SCHEMA)
        (out / "events" / f"epoch={epoch}").mkdir(parents=True)
        pq.write_table(
            table.drop_columns(["epoch"]), out / "events" / f"epoch={epoch}" / "run-0-0-part-0.parquet"
        )


def _history_across_the_flag(bc) -> None:
    """Before the flag: tasks done, retried and dead, every broker restarted (none describes that part).
    After: more of the same, leases that expire and a requeue."""
    cluster = bc.cluster
    with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=60) as client:
        _round(bc, client, "before")
    for index, broker in enumerate(bc.brokers):
        broker.terminate()
        bc.brokers[index] = bc.procs.restart(broker)
    enable(cluster.zk, cluster.paths, FLAG, check=lambda: None)
    with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=60) as client:
        _round(bc, client, "after")
        for i in range(4):
            client.submit("slow", b"s", key=f"s{i}", max_attempts=1)
    leader = bc.leader_proc()
    assert (
        len(call(leader.address, "lease", worker="gone", queues=["slow"], max_tasks=4, lease_ms=200)["tasks"])
        == 4
    )

    def slow_dead() -> int:
        queues = call(leader.address, "list_queues")["queues"]
        return next(q for q in queues if q["queue"] == "slow")["counts"].get("dead", 0)

    wait_for(lambda: slow_dead() == 4, 30, "the short leases to expire")
    assert call(leader.address, "requeue_dead", queue="slow")["requeued"] == 4
    with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=60) as client:
        work(bc, ["slow"], client)


def _write_epoch(bc, store: StateStore, batches) -> tuple[int, list]:
    """Entries written straight to a new epoch's ledger, as a leader writes them (each applied to the
    leader's ``store`` first); each callable of ``batches`` makes its events from the results before."""
    zk, paths = bc.cluster.zk, bc.cluster.paths
    ledgers, version = read_log(zk, paths)
    epoch = max(item["epoch"] for item in ledgers) + 1
    client = LedgerClient(zk, paths)
    try:
        writer = client.create(epoch=epoch)
        append_ledger(zk, paths, writer.ledger_id, epoch, version)
        results: list = []
        for entry_id, make in enumerate(batches):
            events = make(writer.ledger_id, results)
            results.append((events, store.apply_batch(events, (writer.ledger_id, entry_id))))
            assert writer.add(encode_batch(events)).result(30.0) == entry_id
        writer.close()
    finally:
        client.close()
    return writer.ledger_id, results


def test_a_history_across_the_flag_audits_clean_and_a_completion_its_outcomes_make_stale_is_found(
    spark, digesting_cluster, tmp_path
):
    bc = digesting_cluster
    address = ClusterAddress(bc.zk_hosts, bc.cluster.name)
    _history_across_the_flag(bc)
    mid = _snapshot(
        bc, tmp_path
    )  # after the flag: a second range, whose Outcomes may describe the range before's
    leader = bc.leader_proc()
    for broker in bc.brokers:
        broker.terminate()

    report = audit_cluster(spark, address, snapshot=[mid["path"]])
    doc = report.summary()
    assert report.findings == [], doc["findings"]
    ranges = doc["shards"][0]["ranges"]
    assert len(ranges) == 2 and sum(r["outcomes"] for r in ranges) > 0, ranges
    _write_export(address, tmp_path / "export")  # the same rows replayed in one piece, in the driver
    whole = audit_export(tmp_path / "export").summary()
    assert whole["findings"] == [] and whole["replay"]["grants"] == doc["replay"]["grants"]

    # A new epoch, written as a leader would on the last leader's store: task "liar" is leased as
    # attempt 1 but the Outcomes say 2, then attempt 1 completes (apply accepts it: stale by the log).
    # Task "late" is leased, expires (told truly), and its attempt 1 completes late: refused, legal.
    now = int(time.time() * 1000) + 60_000

    def outcomes_of(i, lie=False):
        def make(ledger_id, results):
            decided = decisions(*results[i])
            if lie:
                decided = [
                    [index, [[t, 2] if t == "liar" else [t, a] for t, a, *_ in pairs]]
                    for index, pairs in decided
                ]
            return list(outcome_events((ledger_id, i), decided))

        return make

    batches = [
        lambda lid, r: [
            event(
                "EpochStarted",
                epoch=read_log(bc.cluster.zk, bc.cluster.paths)[0][-1]["epoch"],
                broker_id=9,
                now_ms=now,
            )
        ],
        lambda lid, r: [
            event("TaskSubmitted", task_id="liar", queue="inj", payload=b"x", now_ms=now),
            event("TaskSubmitted", task_id="late", queue="inj2", payload=b"x", now_ms=now),
        ],
        lambda lid, r: [
            event("TaskLeased", worker="w1", queues=["inj"], max_tasks=1, lease_ms=600_000, now_ms=now + 1),
            event("TaskLeased", worker="w2", queues=["inj2"], max_tasks=1, lease_ms=1_000, now_ms=now + 1),
        ],
        outcomes_of(2, lie=True),
        lambda lid, r: [event("LeaseExpired", now_ms=now + 10_000)],
        outcomes_of(4),
        lambda lid, r: [
            event("TaskCompleted", task_id="late", attempt=1, now_ms=now + 10_001),
            event("TaskCompleted", task_id="liar", attempt=1, now_ms=now + 10_001),
        ],
    ]
    with StateStore(leader.data_dir / "state", sync=False) as store:
        ledger_id, results = _write_epoch(bc, store, batches)
    late, liar = results[6][1]
    assert not late["ok"] and liar["ok"], results[6]

    report = audit_cluster(spark, address, snapshot=[mid["path"]])
    found = [(f.kind, f.shard, f.ledger, f.entry, f.task_id) for f in report.findings]
    assert found == [("stale_completion", 0, ledger_id, 6, "liar")], report.summary()["findings"]
    assert "TaskCompleted by attempt 1 accepted while attempt 2 was current" in report.findings[0].detail
