"""A broker's store.status through its life: signed at first use, dirty while it runs, kept
across restarts (an old store without one is signed from its cluster id), and a status of
another cluster refused with "wrong store" like the LMDB record is.
"""

from __future__ import annotations

import json

import pytest

from election.cluster_config import ClusterOptions, ensure_cluster_config
from election.identity import META
from election.local.store_status import StoreStatus, read_status, status_path, write_status
from ledger.log import write_log
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_a_store_status_of_another_cluster_is_refused_as_a_wrong_store(cluster, procs, tmp_path):
    config = ensure_cluster_config(cluster.zk, cluster.paths, ClusterOptions(), clock=lambda: 1.0)
    write_log(cluster.zk, cluster.paths, [{"id": 0, "epoch": 1}], expected_version=-1, claim=None)
    data = tmp_path / "foreign"
    write_status(data, StoreStatus("0b9e4c9e-another-cluster", 5.0))
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
    assert result.returncode == 1 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last == (
        f"fencepost: wrong store: {data} belongs to cluster 0b9e4c9e-another-cluster, "
        f"this cluster ({cluster.name}) is {config['cluster_id']}"
    ), last
    assert not (data / META).exists() and not (data / "state").exists()


def test_the_signature_is_set_once_and_the_store_is_dirty_while_a_broker_runs(broker_cluster):
    bc = broker_cluster
    config = json.loads(bc.cluster.zk.get(bc.cluster.paths.config)[0])
    proc = next(p for p in bc.brokers if p is not bc.leader_proc())
    first = read_status(proc.data_dir)
    # The cluster's signature, the same in every member's store.
    assert first is not None and first.state == "dirty"
    assert first.initial_signature == (config["cluster_id"], config["created_at"])
    assert {read_status(p.data_dir).initial_signature for p in bc.brokers} == {first.initial_signature}
    assert proc.terminate() == 0
    assert read_status(proc.data_dir) == first  # an ordinary stop is not a cluster shutdown
    proc = bc.procs.restart(proc)
    assert read_status(proc.data_dir).initial_signature == first.initial_signature
    # A store from before store.status: signed from the cluster its records name.
    assert proc.terminate() == 0
    status_path(proc.data_dir).unlink()
    proc = bc.procs.restart(proc)
    again = wait_for(lambda: read_status(proc.data_dir), 10, "the store to be signed")
    assert again.initial_signature == first.initial_signature and again.state == "dirty"
