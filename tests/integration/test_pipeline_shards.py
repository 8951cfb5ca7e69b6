"""export, analyze and audit on a real 3-shard cluster (3 bookies, 3 brokers each hosting every shard; Spark local).

Keyed submits reach every shard and a Worker completes them all. Then:

- `export` reads every shard's log in one Spark read: rows of shards 0, 1 and 2 under
  `events/shard=N/epoch=E/`, each task's row in the shard its id names; a second run after
  submits to one shard appends each shard's entries after its bookmark, none twice;
- `analyze` covers every shard: each task once with its shard, every shard's epochs;
- `audit` checks every shard (each shard's replay against its own brokers' digests) and is
  clean; after one bookie's copy of an entry of a shard-2 ledger is flipped on disk, it names
  that copy with shard 2.
"""

from __future__ import annotations

import json
import threading

import pyarrow.parquet as pq
import pytest

from broker.api.client import Client
from broker.api.worker import Worker
from election.leader import read_leader
from election.shards import shard_of_key, shard_of_task
from ledger.log import read_log
from ledger.metadata import read_metadata
from pipeline.analyze_run import HistorySource, run_analyze
from pipeline.audit import audit_cluster, plan_audit
from pipeline.export import export_history, read_bookmark
from pipeline.plan import ClusterAddress
from pipeline.rows import parse_position
from tests.support.harness import wait_for
from tests.support.ledgers import corrupt_entry_on_disk

pytestmark = pytest.mark.integration

SHARDS = 3
PER_SHARD = 8


def keys_by_shard(count: int, prefix: str) -> dict[int, list[str]]:
    """``count`` keys for each shard, found by the key hash."""
    out: dict[int, list[str]] = {n: [] for n in range(SHARDS)}
    i = 0
    while any(len(keys) < count for keys in out.values()):
        key = f"{prefix}-{i}"
        if len(out[shard_of_key(key, SHARDS)]) < count:
            out[shard_of_key(key, SHARDS)].append(key)
        i += 1
    return out


def start_cluster(cluster, procs):
    result = procs.run(
        ["cluster", "init", "--zk", cluster.hosts, "--cluster", cluster.name, "--shards", str(SHARDS)]
    )
    assert result.returncode == 0, result.stderr.decode()
    bookies = procs.start_bookies(cluster, 3)
    procs.start_brokers(cluster, 3)
    # Leaders spread (each broker leads one shard) before the work, so no handover writes during the checks.
    wait_for(
        lambda: (
            len(
                {
                    (read_leader(cluster.zk, cluster.paths.of_shard(n)) or {}).get("broker_id")
                    for n in range(SHARDS)
                }
                - {None}
            )
            == SHARDS
        ),
        240,
        "each broker leading one shard",
    )
    return bookies


def run_work(client: Client) -> dict[str, int]:
    """Keyed submits to every shard, all completed by one Worker; each task id's shard."""
    ids = [
        client.submit("pipe", b"x" * 10, key=k)
        for keys in keys_by_shard(PER_SHARD, "k").values()
        for k in keys
    ]
    worker = Worker(
        client=client,
        queues=["pipe"],
        concurrency=2,
        wait_ms=300,
        handle_signals=False,
        handlers={"pipe": lambda task: b"ok"},
    )
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        done = [client.wait(task_id, timeout=60) for task_id in ids]
    finally:
        worker.stop()
        runner.join(30)
    assert [t["state"] for t in done] == ["done"] * len(ids)
    return {task_id: shard_of_task(task_id) for task_id in ids}


def damage_a_shard_2_copy(cluster, procs, bookies) -> tuple[int, int, str]:
    """Flip one bookie's copy of an entry of shard 2's last ledger; (ledger, entry, bookie id)."""
    ledgers, _ = read_log(cluster.zk, cluster.paths.of_shard(2))
    ledger_id = ledgers[-1]["id"]
    meta, _ = read_metadata(cluster.zk, cluster.paths, ledger_id)
    assert meta.shard == 2
    entry_id = min(2, meta.last_entry if meta.last_entry is not None and meta.last_entry >= 0 else 2)
    victim = bookies[1]
    bookie_id = next(m["bookie_id"] for m in meta.ensemble_for(entry_id) if m["address"] == victim.address)
    assert victim.terminate() == 0
    corrupt_entry_on_disk(victim.data_dir, ledger_id, entry_id)
    bookies[1] = procs.restart(victim)
    return ledger_id, entry_id, bookie_id


def test_export_analyze_and_audit_read_and_check_every_shard(spark, cluster, procs, tmp_path):
    bookies = start_cluster(cluster, procs)
    address = ClusterAddress(cluster.hosts, cluster.name)
    with Client(zk=cluster.hosts, cluster=cluster.name, timeout=60) as client:
        assert client.shards == SHARDS
        shard_of = run_work(client)
        assert set(shard_of.values()) == {0, 1, 2}

        # export: every shard's history in one read, partitioned by shard then epoch.
        out = tmp_path / "export"
        first = export_history(spark, address, out, entries_per_partition=5)
        assert [s["shard"] for s in first["shards"]] == [0, 1, 2] and all(
            s["entries"] > 0 for s in first["shards"]
        )
        assert {p.parent.parent.name for p in out.glob("events/*/epoch=*/*.parquet")} == {
            "shard=0",
            "shard=1",
            "shard=2",
        }
        assert read_bookmark(out)["shards"] == SHARDS
        rows = spark.read.format("fencepost").load(str(out))
        assert sorted(r.shard for r in rows.select("shard").distinct().collect()) == [0, 1, 2]
        submitted = {
            r.task_id: r.shard
            for r in rows.where("type = 'TaskSubmitted'").select("task_id", "shard").collect()
        }
        assert submitted == shard_of, "a task's submit is not in the shard its id names"
        live = spark.read.format("fencepost").option("zk", cluster.hosts).option("cluster", cluster.name)
        assert rows.count() == live.option("to", first["to"]).load().count()

        # A second run after submits to shard 1 alone appends only shard 1's new entries.
        later = [client.submit("later", b"y", key=k) for k in keys_by_shard(3, "later")[1]]
        assert {shard_of_task(t) for t in later} == {1}
        second = export_history(spark, address, out)
    # Every shard's run starts after its first run's end; shard 1's holds the new submits.
    ends = {s["shard"]: parse_position(s["to"]) for s in first["shards"]}
    assert all(parse_position(s["from"]) > ends[s["shard"]] for s in second["shards"]), second
    assert 1 in {s["shard"] for s in second["shards"]}
    again = spark.read.format("fencepost").load(str(out)).where("type = 'TaskSubmitted' and queue = 'later'")
    assert {(r.task_id, r.shard) for r in again.collect()} == {(t, 1) for t in later}
    table = pq.ParquetDataset(str(out / "events")).read()
    keys = list(
        zip(table["ledger_id"].to_pylist(), table["entry_id"].to_pylist(), table["event_index"].to_pylist())
    )
    assert len(keys) == len(set(keys)) == first["events"] + second["events"], "an entry exported twice"

    # analyze: every shard's tasks, once each, with their shard; each shard's epochs.
    summary = run_analyze(spark, HistorySource(address=address), tmp_path / "analysis")
    tasks = pq.read_table(tmp_path / "analysis" / "tasks").to_pylist()
    assert {t["task_id"]: t["shard"] for t in tasks if t["queue"] == "pipe"} == shard_of
    assert all(t["final_state"] == "done" for t in tasks if t["queue"] == "pipe")
    assert sorted({e["shard"] for e in pq.read_table(tmp_path / "analysis" / "epochs").to_pylist()}) == [
        0,
        1,
        2,
    ]
    assert [s["shard"] for s in summary["shards"]] == [0, 1, 2] and summary["queues"]["pipe"]["done"] == len(
        shard_of
    )

    # audit: every shard checked, each against its own brokers, clean.
    report = audit_cluster(spark, address, entries_per_partition=10)
    doc = report.summary()
    assert report.findings == [], doc["findings"]
    assert [s["shard"] for s in doc["shards"]] == [0, 1, 2] and all(s["entries"] > 0 for s in doc["shards"])
    assert doc["copies"]["ok"] == 3 * report.entries
    for shard in doc["shards"]:
        assert shard["brokers"] >= 1, (
            f"no broker digest of shard {shard['shard']} was compared: {doc['brokers']}"
        )
    assert {b["shard"] for b in doc["brokers"]} == {0, 1, 2}
    json.dumps(doc)

    # One bookie's copy of an entry of a shard-2 ledger, flipped: the audit names it with shard 2.
    ledger_id, entry_id, bookie_id = damage_a_shard_2_copy(cluster, procs, bookies)
    report = audit_cluster(spark, address, entries_per_partition=10, plan=plan_audit(address))
    found = [(f.kind, f.shard, f.ledger, f.entry, f.bookie) for f in report.findings]
    assert found == [("corrupt_replica", 2, ledger_id, entry_id, bookie_id)], report.summary()["findings"]
    assert all(s.replay is not None and s.replay.last is not None for s in report.shards), "a replay stopped"
