"""`analyze` of a history that spans the event_outcomes flag (real cluster, real Spark in local mode).

Before the flag: tasks done, retried and dead, then every broker restarted, so no broker can
describe that part. Then the flag, and more of the same plus leases that expire and a requeue.
The analysis replays only up to the last entry no Outcomes describe, reads the rest from the
Outcomes events, and its tables equal those of a run that replays everything.
"""

from __future__ import annotations

import pytest

from broker.api.client import Client
from broker.state.outcomes import FLAG
from election.features import enable
from pipeline.analyze_run import HistorySource, run_analyze
from pipeline.plan import ClusterAddress
from pipeline.rows import parse_position
from tests.support.harness import call, wait_for
from tests.support.pipeline_runs import read_tables, work

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _some_work(bc, client, tag: str) -> None:
    for i in range(20):
        client.submit("mail", b"bad" if i % 5 == 0 else b"fine", key=f"{tag}{i}", max_attempts=2)
    work(bc, ["mail"], client)


def test_a_history_across_the_flag_is_analysed_as_a_full_replay_would(spark, broker_cluster, tmp_path):
    bc = broker_cluster
    cluster = bc.cluster
    with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=60) as client:
        _some_work(bc, client, "before")
    for index, broker in enumerate(bc.brokers):  # what they applied before is described by none of them
        broker.terminate()
        bc.brokers[index] = bc.procs.restart(broker)
    leader = bc.leader_proc()
    before_flag = tuple(call(leader.address, "status")["position"])
    enable(cluster.zk, cluster.paths, FLAG, check=lambda: None)
    with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=60) as client:
        _some_work(bc, client, "after")
        for i in range(4):
            client.submit("slow", b"s", key=f"s{i}", max_attempts=1)
    leader = bc.leader_proc()
    expiring = call(leader.address, "lease", worker="gone", queues=["slow"], max_tasks=4, lease_ms=200)[
        "tasks"
    ]
    assert len(expiring) == 4

    def slow_dead() -> int:
        queues = call(leader.address, "list_queues")["queues"]
        return next(q for q in queues if q["queue"] == "slow")["counts"].get("dead", 0)

    wait_for(lambda: slow_dead() == 4, 30, "the short leases to expire")
    assert call(leader.address, "requeue_dead", queue="slow")["requeued"] == 4
    with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=60) as client:
        work(bc, ["slow"], client)
    # Nothing more is written: both runs read the same history.
    for broker in bc.brokers:
        broker.terminate()

    source = HistorySource(address=ClusterAddress(bc.zk_hosts, cluster.name))
    mixed = run_analyze(spark, source, tmp_path / "mixed")
    full = run_analyze(spark, source, tmp_path / "full", replay_all=True)

    assert read_tables(tmp_path / "mixed") == read_tables(tmp_path / "full")
    replayed_to = parse_position(mixed["replayed"]["0"]["to"])
    assert replayed_to <= before_flag < parse_position(mixed["to"])
    assert mixed["replayed"]["0"]["entries"] < full["replayed"]["0"]["entries"] == full["entries"]
    assert mixed["queues"]["slow"]["done"] == 4 and mixed["queues"]["mail"]["dead"] == 8
