"""`analyze` and `audit` of a real history using expiry before start and queue length limits, by each
engine (in this process and with Spark in local mode), and `analyze --spark` forcing Spark on a small
history from the command line.

The history (task_expiry and queue_limits enabled, event_outcomes too, so nothing but these decisions is
replayed): keyed tasks with a 1 s expiry that nobody leases in time (expired, by the leader's TasksExpired
or a lease meeting them), a queue whose overflow drops its oldest waiting task, one that dead-letters it,
and one that refuses the submit (queue_full); then a worker drains what is left. Both engines count the
expired, dropped and dead-lettered tasks alike, the refused submits create nothing, and the audit finds
nothing.
"""

from __future__ import annotations

import json

import pytest

from pipeline.analyze_run import HistorySource, run_analyze
from pipeline.arrow_history import SMALL_EVENTS
from pipeline.audit import audit_cluster, plan_audit
from pipeline.frames import ArrowFrames
from pipeline.plan import ClusterAddress
from tests.support.limits_history import EXPIRING, LIMIT, write_limits_history
from tests.support.pipeline_runs import read_tables, same_history_facts

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def test_both_engines_count_expired_dropped_and_dead_lettered_tasks_alike(spark, broker_cluster, tmp_path):
    bc = broker_cluster
    write_limits_history(bc)
    address = ClusterAddress(bc.zk_hosts, bc.cluster.name)
    source = HistorySource(address=address)

    here = run_analyze(ArrowFrames(limit=SMALL_EVENTS), source, tmp_path / "pyarrow")
    there = run_analyze(spark, source, tmp_path / "spark")
    assert (here["engine"], there["engine"]) == ("pyarrow", "spark")
    assert read_tables(tmp_path / "pyarrow") == read_tables(tmp_path / "spark")
    assert same_history_facts(here) == same_history_facts(there)
    queues = here["queues"]
    assert queues["exp"]["expired"] == EXPIRING and queues["exp"]["waiting"] == 0
    assert queues["mail"]["expired"] == 1
    assert (queues["drop"]["dropped"], queues["drop"]["done"]) == (2, LIMIT)
    assert (queues["dl"]["dead"], queues["dl"]["dead_lettered"], queues["dl"]["done"]) == (2, 2, LIMIT)
    assert sum(queues["rej"].values()) == LIMIT and queues["rej"]["done"] == LIMIT  # refused: no task
    assert here["replayed"]["0"]["entries"] == here["entries"], "a shard using the features is replayed"
    assert "expired" in (tmp_path / "pyarrow" / "report.html").read_text()

    audited_here = audit_cluster(ArrowFrames(limit=SMALL_EVENTS), address, entries_per_partition=10)
    audited_there = audit_cluster(spark, address, entries_per_partition=10, plan=plan_audit(address))
    assert audited_here.findings == [] and audited_there.findings == []
    assert same_history_facts(audited_here.summary()) == same_history_facts(audited_there.summary())

    # The command with --spark starts Spark (in its own process) for this small history all the same.
    where = ["--zk", bc.zk_hosts, "--cluster", bc.cluster.name]
    result = bc.procs.run(
        ["analyze", *where, "--spark", "--out", str(tmp_path / "cli"), "--json"], timeout=300
    )
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    doc = json.loads(result.stdout)
    assert doc["engine"] == "spark"
    assert same_history_facts(doc) == same_history_facts(here)
    assert read_tables(tmp_path / "cli") == read_tables(tmp_path / "pyarrow")
