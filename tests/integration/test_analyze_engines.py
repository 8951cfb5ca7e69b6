"""`analyze` and `audit` of one small history by each engine: in this process (pyarrow) and with Spark
(real cluster, real Spark in local mode). Both write the same tables and find the same findings.

The history spans the event_outcomes flag (its first part replayed, the rest read from Outcomes
events) and holds retries, dead tasks, a cancel, expired leases and a requeue.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import cli
from broker.api.client import Client
from broker.state.outcomes import FLAG
from election.features import enable
from ledger.metadata import read_metadata
from pipeline.analyze_run import HistorySource, run_analyze
from pipeline.arrow_history import SMALL_EVENTS, TooLarge
from pipeline.audit import audit_cluster, plan_audit
from pipeline.export import export_history
from pipeline.frames import ArrowFrames
from pipeline.plan import ClusterAddress, Connection
from tests.support.harness import call, wait_for
from tests.support.ledgers import corrupt_entry_on_disk
from tests.support.pipeline_runs import read_tables, same_history_facts, work

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _history(bc) -> None:
    cluster = bc.cluster
    with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=60) as client:
        for i in range(12):
            client.submit("mail", b"bad" if i % 4 == 0 else b"fine", key=f"before{i}", max_attempts=2)
        cancelled = client.submit("mail", b"later", key="cancelled", delay=3600)
        client.cancel(cancelled)
        work(bc, ["mail"], client)
    for index, broker in enumerate(bc.brokers):  # what they applied before is described by none of them
        broker.terminate()
        bc.brokers[index] = bc.procs.restart(broker)
    enable(cluster.zk, cluster.paths, FLAG, check=lambda: None)
    with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=60) as client:
        for i in range(8):
            client.submit("mail", b"bad" if i % 4 == 0 else b"fine", key=f"after{i}", max_attempts=2)
        for i in range(3):
            client.submit("slow", b"s", key=f"s{i}", max_attempts=1)
        work(bc, ["mail"], client)
    leader = bc.leader_proc()
    assert (
        len(call(leader.address, "lease", worker="gone", queues=["slow"], max_tasks=3, lease_ms=200)["tasks"])
        == 3
    )

    def slow_dead() -> int:
        queues = call(leader.address, "list_queues")["queues"]
        return next(q for q in queues if q["queue"] == "slow")["counts"].get("dead", 0)

    wait_for(lambda: slow_dead() == 3, 30, "the short leases to expire")
    assert call(leader.address, "requeue_dead", queue="slow")["requeued"] == 3
    with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=60) as client:
        work(bc, ["slow"], client)
    # Nothing more is written: every run below reads the same history.
    for broker in bc.brokers:
        broker.terminate()


def test_both_engines_analyze_and_audit_a_small_history_alike(spark, broker_cluster, tmp_path):
    bc = broker_cluster
    _history(bc)
    address = ClusterAddress(bc.zk_hosts, bc.cluster.name)
    source = HistorySource(address=address)

    here = run_analyze(ArrowFrames(limit=SMALL_EVENTS), source, tmp_path / "pyarrow")
    there = run_analyze(spark, source, tmp_path / "spark")
    assert (here["engine"], there["engine"]) == ("pyarrow", "spark")
    assert read_tables(tmp_path / "pyarrow") == read_tables(tmp_path / "spark")
    assert same_history_facts(here) == same_history_facts(there)
    assert here["replayed"]["0"]["entries"] < here["entries"], "the Outcomes part was replayed"
    assert here["queues"]["mail"]["dead"] == 5 and here["queues"]["slow"]["done"] == 3
    assert here["queues"]["mail"]["cancelled"] == 1
    assert "pyarrow" in (tmp_path / "pyarrow" / "report.html").read_text()

    # The same history from an export directory, in this process.
    export_history(spark, address, tmp_path / "export")
    run_analyze(ArrowFrames(), HistorySource(export_dir=tmp_path / "export"), tmp_path / "from-export")
    assert read_tables(tmp_path / "from-export") == read_tables(tmp_path / "spark")

    # The command chooses the in-process engine for it by itself.
    where = ["--zk", bc.zk_hosts, "--cluster", bc.cluster.name]
    result = CliRunner().invoke(cli.main, ["analyze", *where, "--out", str(tmp_path / "cli"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["engine"] == "pyarrow"
    assert read_tables(tmp_path / "cli") == read_tables(tmp_path / "spark")

    # A history over the limit is refused before anything is written (the command then starts Spark).
    with pytest.raises(TooLarge):
        run_analyze(ArrowFrames(limit=here["events"] - 1), source, tmp_path / "too-large")
    assert not (tmp_path / "too-large").exists()

    # One bookie's copy of an entry flipped on disk: both engines find it, and only it.
    with Connection.open(address) as conn:
        ledger_id = next(e.ledger_id for e in conn.extents() if e.last >= 2)
    meta, _ = read_metadata(bc.cluster.zk, bc.cluster.paths, ledger_id)
    victim = bc.bookies[1]
    bookie_id = next(m["bookie_id"] for m in meta.ensemble_for(2) if m["address"] == victim.address)
    assert victim.terminate() == 0
    corrupt_entry_on_disk(victim.data_dir, ledger_id, 2)
    bc.bookies[1] = bc.procs.restart(victim)

    audited_here = audit_cluster(ArrowFrames(limit=SMALL_EVENTS), address, entries_per_partition=10)
    audited_there = audit_cluster(spark, address, entries_per_partition=10, plan=plan_audit(address))
    assert (audited_here.engine, audited_there.engine) == ("pyarrow", "spark")
    assert same_history_facts(audited_here.summary()) == same_history_facts(audited_there.summary())
    kinds = [(f.kind, f.ledger, f.entry, f.bookie) for f in audited_here.findings]
    assert kinds == [("corrupt_replica", ledger_id, 2, bookie_id)], audited_here.summary()["findings"]
    assert audited_here.summary()["replay"]["grants"] > 0

    with pytest.raises(TooLarge):
        audit_cluster(ArrowFrames(limit=here["events"] - 1), address)
    result = CliRunner().invoke(cli.main, ["audit", *where, "--entries-per-partition", "10", "--json"])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)  # stdout alone: the reader may log a line on stderr under load
    assert doc["engine"] == "pyarrow" and doc["findings"] == audited_there.summary()["findings"]
