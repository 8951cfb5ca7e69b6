"""`audit` on a real cluster's history (Spark in local mode): clean, then one bookie's copy flipped on disk."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import cli
from broker.api.client import Client
from ledger.log import read_log
from ledger.metadata import read_metadata
from pipeline.audit import audit_cluster, plan_audit
from pipeline.history import cluster_entries
from pipeline.plan import ClusterAddress
from pipeline.rows import SCHEMA, entry_rows
from tests.support.ledgers import corrupt_entry_on_disk

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def work(bc):
    """Submits, leases (one of them left to expire) and completions: a history with grants in it."""
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name) as client:
        ids = [client.submit("audit", f"job {i}".encode()) for i in range(12)]
        client.call("lease", worker="slow", queues=["audit"], max_tasks=2, lease_ms=100)
        leased = client.call("lease", worker="w", queues=["audit"], max_tasks=8)["tasks"]
        client.complete_many([{"task_id": t["task_id"], "attempt": t["attempt"]} for t in leased])
    return ids


def write_export(address, out):
    by_epoch = {}
    for ledger_id, entry_id, epoch, payload in cluster_entries(address):
        by_epoch.setdefault(epoch, []).extend(entry_rows(ledger_id, entry_id, epoch, payload))
    for epoch, rows in by_epoch.items():
        table = pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows], schema=SCHEMA)
        (out / "events" / f"epoch={epoch}").mkdir(parents=True)
        pq.write_table(
            table.drop_columns(["epoch"]), out / "events" / f"epoch={epoch}" / "run-0-0-part-0.parquet"
        )


def test_audit_is_clean_then_names_the_bookie_and_entry_of_a_flipped_copy(spark, broker_cluster, tmp_path):
    bc = broker_cluster
    work(bc)
    address = ClusterAddress(bc.zk_hosts, bc.cluster.name)

    steps = []
    report = audit_cluster(
        spark, address, entries_per_partition=10, progress=lambda *step: steps.append(step)
    )
    summary = report.summary()
    assert report.findings == [], summary
    assert summary["replay"]["grants"] >= 10 and summary["copies"]["ok"] == 3 * report.entries
    compared = [b for b in summary["brokers"] if b["compared"]]
    assert compared, f"no broker's digest was compared: {summary['brokers']}"
    assert {what for what, _, _ in steps} == {"replicas", "replay (entries)"}

    # The same history as an export directory (written here without Spark, in the export's layout):
    # the command audits it clean and replays the same leases.
    write_export(address, tmp_path / "export")
    result = CliRunner().invoke(cli.main, ["audit", "--from-export", str(tmp_path / "export"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["clean"] and doc["replay"]["grants"] == summary["replay"]["grants"]

    # Flip one byte of one bookie's copy of an entry in the middle of the log (a cleanly stopped
    # bookie does not verify its store when it starts again, so it serves the damaged copy).
    ledgers, _ = read_log(bc.cluster.zk, bc.cluster.paths)
    ledger_id = ledgers[-1]["id"]
    meta, _ = read_metadata(bc.cluster.zk, bc.cluster.paths, ledger_id)
    victim = bc.bookies[1]
    bookie_id = next(m["bookie_id"] for m in meta.ensemble_for(2) if m["address"] == victim.address)
    assert victim.terminate() == 0
    corrupt_entry_on_disk(victim.data_dir, ledger_id, 2)
    bc.bookies[1] = bc.procs.restart(victim)

    report = audit_cluster(spark, address, entries_per_partition=10, plan=plan_audit(address))
    kinds = [(f.kind, f.ledger, f.entry, f.bookie) for f in report.findings]
    assert kinds == [("corrupt_replica", ledger_id, 2, bookie_id)], report.summary()["findings"]
    assert report.replay is not None and report.replay.last is not None, "the replay read past the bad copy"
