"""`fencepost store inspect` and `store mark-clean` through the real CLI: on stores built with events
applied (a total failure's leftovers), and on the stores of a running cluster (read-only, never refused)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.server.store.datalock import DataDirLock
from broker.state.events import event
from broker.state.store import StateStore
from election.local.store_status import StoreStatus, ensure_status, mark_clean, read_status, write_status
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MAP = 64 << 20
CLUSTER = "5d0c7c3e9a7b4b8e8f6f1d2a3b4c5d6e"


def build(
    data: Path, tasks: int, epoch: int = 2, entries: int = 1, cluster: str = CLUSTER, status: bool = True
) -> tuple[int, int]:
    """A broker data dir whose store applied an epoch start and ``tasks`` tasks over ``entries`` entries."""
    store = StateStore(data / "state", map_size=MAP)
    store.set_cluster_id(cluster)
    store.apply_batch([event("EpochStarted", epoch=epoch, broker_id=1, now_ms=1)], (3, 0))
    for e in range(entries):
        store.apply_batch(
            [
                event("TaskSubmitted", task_id=f"t{e}-{i}", queue="q", payload=b"p", now_ms=5 + e)
                for i in range(tasks // entries)
            ],
            (3, 1 + e),
        )
    position = store.position()
    store.close()
    if status:
        ensure_status(data, cluster, 1700000000.0)
    return position


def inspect(procs, *dirs, extra=()):
    return procs.run(["store", "inspect", *map(str, dirs), *extra])


def test_inspect_after_a_dirty_total_failure_then_mark_clean_the_newest(procs, tmp_path):
    b0, b1, b2 = tmp_path / "b0", tmp_path / "b1", tmp_path / "b2"
    build(b0, 10, entries=2)
    newest_position = build(b1, 12, entries=3)  # applied the most
    build(b2, 4, entries=1)
    res = inspect(procs, b0, b1, b2)
    assert res.returncode == 0, res.stderr
    out = res.stdout.decode()
    assert f"{b1}: cluster {CLUSTER}  state dirty" in out and "tasks 12" in out
    assert f"newest: {b1}" in out
    assert "a restart without a log would: manual recovery needed: run `fencepost store inspect`" in out
    report = json.loads(inspect(procs, b0, b1, b2, extra=["--json"]).stdout)
    assert [s["tasks"] for s in report["stores"]] == [10, 12, 4]
    assert [s["position"] for s in report["stores"]] == [[3, 2], [3, 3], [3, 1]]
    assert report["newest"] == str(b1) and report["restart"]["action"] == "abort"
    assert report["clusters"] == [
        {
            "cluster_id": CLUSTER,
            "created_at": 1700000000.0,
            "paths": [str(b0), str(b1), str(b2)],
            "newest": str(b1),
        }
    ]
    assert all(len(s["digest"]) == 32 and s["epoch"] == 2 for s in report["stores"])

    marked = procs.run(["store", "mark-clean", str(b1), "--yes", "--json"])
    assert marked.returncode == 0, marked.stderr
    result = json.loads(marked.stdout)
    assert result["marked"] and result["shutdown_id"].startswith("manual-")
    status = read_status(b1)
    assert status.clean and status.position == newest_position and status.shutdown_id == result["shutdown_id"]

    after = json.loads(inspect(procs, b0, b1, b2, extra=["--json"]).stdout)
    assert after["restart"]["action"] == "restore"
    assert after["restart"]["summary"] == f"restore from {b1}"
    assert (
        "members 1 (" in after["restart"]["reason"]
        and "take their state from it" in after["restart"]["reason"]
    )


def test_inspect_tells_clusters_apart_and_reports_unreadable_dirs(procs, tmp_path):
    build(tmp_path / "a", 3)
    build(tmp_path / "b", 3, cluster="0f" * 16)
    (tmp_path / "damaged" / "state").mkdir(parents=True)
    (tmp_path / "damaged" / "state" / "data.mdb").write_bytes(b"\x07" * 64)
    (tmp_path / "fresh").mkdir()
    dirs = [tmp_path / n for n in ("a", "b", "damaged", "fresh", "missing")]
    res = inspect(procs, *dirs)
    out, err = res.stdout.decode(), res.stderr.decode()
    assert res.returncode == 0 and "Traceback" not in out + err
    assert f"{tmp_path / 'damaged'}: UNREADABLE: state store" in out and "damaged" in out
    assert f"{tmp_path / 'missing'}: UNREADABLE: {tmp_path / 'missing'} does not exist" in out
    assert f"{tmp_path / 'fresh'}: no state store" in out
    assert "the stores belong to different clusters" in out
    assert "a restart without a log would: the stores are not of one cluster" in out
    report = json.loads(inspect(procs, *dirs, extra=["--json"]).stdout)
    assert report["readable"] == 3 and len(report["clusters"]) == 2
    none = inspect(procs, tmp_path / "damaged", tmp_path / "missing")
    assert none.returncode == 1 and none.stderr.decode().strip().endswith("fencepost: no store could be read")


def test_inspect_after_an_orderly_shutdown_says_restore(procs, tmp_path):
    dirs = [tmp_path / f"b{i}" for i in range(3)]
    for d in dirs:
        position = build(d, 5)
        mark_clean(d, "shutdown-1", position)
    (tmp_path / "b3").mkdir()  # a fourth member lost its disk
    report = json.loads(inspect(procs, *dirs, tmp_path / "b3", extra=["--json", "--verify"]).stdout)
    assert [s["state"] for s in report["stores"]] == ["clean", "clean", "clean", "none"]
    assert report["restart"]["summary"] == f"restore from {dirs[0]}"
    assert f"member 4 ({tmp_path / 'b3'}) takes its state from it" in report["restart"]["reason"]


def test_mark_clean_refusals(procs, tmp_path):
    data = tmp_path / "b0"
    build(data, 3)
    lock = DataDirLock(data)
    lock.acquire()  # what a running broker holds
    try:
        res = procs.run(["store", "mark-clean", str(data), "--yes"])
        assert res.returncode == 1 and "in use" in res.stderr.decode()
        assert len(res.stderr.decode().strip().splitlines()) == 1
    finally:
        lock.release()

    res = procs.run(["store", "mark-clean", str(data)], input=b"")  # no terminal, no --yes
    assert res.returncode == 2 and "pass --yes" in res.stderr.decode()

    res = procs.run(["store", "mark-clean", str(data), "--yes", "--cluster-id", "another"])
    assert res.returncode == 1 and f"belongs to cluster {CLUSTER}, not another" in res.stderr.decode()

    write_status(data, StoreStatus("another", 1.0))
    res = procs.run(["store", "mark-clean", str(data), "--yes"])
    assert res.returncode == 1 and "of another cluster" in res.stderr.decode()
    assert read_status(data).state == "dirty"

    (tmp_path / "none").mkdir()
    res = procs.run(["store", "mark-clean", str(tmp_path / "none"), "--yes"])
    assert res.returncode == 1 and "holds no state store" in res.stderr.decode()


def test_mark_clean_signs_an_old_store_from_its_recorded_cluster(procs, tmp_path):
    data = tmp_path / "b0"
    position = build(data, 3, status=False)
    res = procs.run(["store", "mark-clean", str(data / "state"), "--yes"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().startswith(f"marked {data / 'state'} clean: shutdown manual-")
    status = read_status(data)
    assert status.cluster_id == CLUSTER and status.clean and status.position == position


def test_inspect_the_stores_of_a_running_cluster(broker_cluster):
    from broker.client import Client

    bc = broker_cluster
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name) as client:
        for i in range(5):
            client.submit("mail", b"x%d" % i)  # returns once committed
    dirs = [p.data_dir for p in bc.brokers]

    def caught_up():
        report = json.loads(bc.procs.run(["store", "inspect", "--json", *map(str, dirs)]).stdout)
        return report if len({s["digest"] for s in report["stores"]}) == 1 else None

    report = wait_for(caught_up, 20, "every store at the leader's digest")
    assert report["readable"] == 3 and len(report["clusters"]) == 1
    assert all(s["tasks"] == 5 and s["epoch"] >= 1 for s in report["stores"])
    assert report["restart"]["action"] == "abort"  # stores of a running cluster are not clean
    res = bc.procs.run(["store", "mark-clean", "--yes", str(dirs[0])])
    assert res.returncode == 1 and "in use" in res.stderr.decode(), res
