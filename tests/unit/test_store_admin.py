"""The back-end of `store inspect` and `store mark-clean` (broker/admin/stores.py): the pure helpers on rows,
then reading and marking real stores in temporary dirs."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker import BrokerError
from broker.admin.stores import (
    _empty_row,
    clusters,
    format_inspect,
    inspect_stores,
    mark_clean_problem,
    mark_clean_store,
    newest,
    read_store,
    restart_decision,
    task_count,
)
from broker.server.store.datalock import DataDirInUse, DataDirLock
from broker.state.events import event
from broker.state.store import StateStore
from election.local.store_status import StoreStatus, ensure_status, read_status, write_status

MAP = 64 << 20


def row(path, kind="dirty", state="dirty", epoch=1, position=(1, 1), cluster="cid-a", created=100.0, **kw):
    r = _empty_row(Path(path))
    r.update(
        kind=kind,
        state=state,
        epoch=epoch,
        position=list(position) if position else None,
        cluster_id=cluster,
        status_cluster_id=cluster,
        store_cluster_id=cluster,
        created_at=created,
    )
    r.update(kw)
    return r


def clean_row(path, shutdown="s1", position=(1, 1), **kw):
    return row(
        path,
        kind="clean",
        state="clean",
        shutdown_id=shutdown,
        status_position=list(position),
        position=position,
        **kw,
    )


# ---------------------------------------------------------------- pure helpers


def test_task_count_leaves_out_delayed_which_are_waiting_too():
    depths = {
        "a": {"waiting": 3, "running": 1, "done": 2, "failed": 0, "dead": 1, "cancelled": 1, "delayed": 2},
        "b": {"waiting": 1, "running": 0, "done": 0, "failed": 0, "dead": 0, "cancelled": 0, "delayed": 0},
    }
    assert task_count(depths) == 9 and task_count({}) == 0


def test_newest_is_the_latest_epoch_then_position_then_clean():
    rows = [
        row("a", epoch=2, position=(1, 5)),
        row("b", epoch=3, position=(1, 1)),
        row("c", epoch=3, position=(1, 0)),
    ]
    assert newest(rows)["path"] == "b"
    rows = [row("a", position=(4, 9)), clean_row("b", position=(4, 9)), row("c", position=(4, 8))]
    assert newest(rows)["path"] == "b"
    skipped = [
        row("e", kind="empty", position=None),
        row("x", epoch=9, error="damaged"),
        _empty_row(Path("t")),
    ]
    assert newest(skipped) is None and newest(skipped + [row("d")])["path"] == "d"


def test_clusters_group_by_initial_signature():
    rows = [
        row("a"),
        row("b", cluster="cid-b"),
        clean_row("c", position=(2, 0)),
        row("d", created=101.0),
        row("e", kind="empty", position=None),
    ]
    groups = clusters(rows)
    assert [g["paths"] for g in groups] == [["a", "c"], ["b"], ["d"]]
    assert groups[0]["newest"] == "c" and groups[0]["cluster_id"] == "cid-a"


def test_restart_decision_uses_the_readable_dirs_as_the_members():
    d = restart_decision([row("a"), clean_row("b"), _empty_row(Path("t")), row("x", error="gone")])
    assert d.action == "restore" and d.source == 2 and d.take_state == (1, 3)
    assert "member 2 (b)" in d.reason
    d = restart_decision([row("a"), row("b")])
    assert d.action == "abort" and d.reason.startswith(
        "manual recovery needed: run `fencepost store inspect`"
    )
    assert restart_decision([row("x", error="gone")]) is None


def test_mark_clean_problems():
    assert mark_clean_problem(row("a"), None) is None
    assert mark_clean_problem(row("a"), "cid-a") is None
    assert "holds no state store" in mark_clean_problem(_empty_row(Path("t")), None)
    assert "empty store" in mark_clean_problem(row("e", kind="empty", position=None), None)
    assert "not cid-b" in mark_clean_problem(row("a"), "cid-b")
    other = row("a", store_cluster_id="cid-z")
    assert "belongs to cluster cid-z but its store.status says cid-a" in mark_clean_problem(other, None)
    unsigned = row("a", status_cluster_id=None, store_cluster_id=None, cluster=None)
    assert "cannot be signed" in mark_clean_problem(unsigned, None)


def test_format_inspect_names_each_store_the_newest_and_the_restart():
    rows = [row("a", tasks=4, digest="d" * 32), clean_row("b", tasks=5), row("x", error="x is damaged: LMDB")]
    report = {
        "stores": rows,
        "clusters": clusters(rows),
        "newest": "b",
        "restart": {"summary": "restore from b", "action": "restore", "reason": "restoring from member 2"},
    }
    text = format_inspect(report)
    assert "a: cluster cid-a  state dirty" in text and "tasks 4" in text
    assert "x: UNREADABLE: x is damaged" in text
    assert "newest: b" in text and "a restart without a log would: restore from b" in text


# ---------------------------------------------------------------- real stores


def make_store(data: Path, tasks: int, cluster="cid-a", status=True, epoch=1, ledger=1) -> tuple[int, int]:
    store = StateStore(data / "state", map_size=MAP)
    store.set_cluster_id(cluster)
    store.apply_batch([event("EpochStarted", epoch=epoch, broker_id=1, now_ms=1)], (ledger, 0))
    if tasks:
        store.apply_batch(
            [
                event("TaskSubmitted", task_id=f"t{i}", queue="q", payload=b"x", now_ms=5)
                for i in range(tasks)
            ],
            (ledger, 1),
        )
    position = store.position()
    store.close()
    if status:
        ensure_status(data, cluster, 100.0)
    return position


def test_read_store_reports_a_real_store(tmp_path):
    make_store(tmp_path / "b0", 6, epoch=4)
    r = read_store(tmp_path / "b0")
    assert r["error"] is None and r["kind"] == "dirty" and r["state"] == "dirty"
    assert r["cluster_id"] == "cid-a" and r["created_at"] == 100.0 and r["position"] == [1, 1]
    assert r["epoch"] == 4 and r["tasks"] == 6 and len(r["digest"]) == 32 and r["problems"] == []
    assert read_store(tmp_path / "b0" / "state")["digest"] == r["digest"]
    assert read_store(tmp_path / "nope")["error"].endswith("does not exist")
    (tmp_path / "t").mkdir()
    assert read_store(tmp_path / "t")["kind"] == "transient"


def test_read_store_flags_a_status_of_another_cluster_and_a_damaged_status(tmp_path):
    make_store(tmp_path / "b0", 1, status=False)
    write_status(tmp_path / "b0", StoreStatus("cid-z", 1.0))
    r = read_store(tmp_path / "b0")
    assert r["problems"] == ["the store records cluster cid-a, its store.status cid-z"]
    (tmp_path / "b0" / "store.status").write_text("{")
    assert "not valid JSON" in read_store(tmp_path / "b0")["error"]


def test_read_store_reports_damage_with_its_reason(tmp_path):
    make_store(tmp_path / "b0", 1)
    (tmp_path / "b0" / "state" / "data.mdb").write_bytes(b"\0" * 100)
    r = read_store(tmp_path / "b0")
    assert "damaged" in r["error"]
    report = inspect_stores([tmp_path / "b0"])
    assert report["readable"] == 0 and report["restart"]["action"] is None


def test_mark_clean_marks_at_the_store_position_with_a_manual_id(tmp_path):
    position = make_store(tmp_path / "b0", 3)
    seen = []
    result = mark_clean_store(tmp_path / "b0", None, lambda plan: seen.append(plan) or True)
    assert (
        result["marked"] and result["shutdown_id"].startswith("manual-") and len(result["shutdown_id"]) == 39
    )
    status = read_status(tmp_path / "b0")
    assert status.clean and status.shutdown_id == result["shutdown_id"] and status.position == position
    assert seen[0]["position"] == list(position)
    again = mark_clean_store(tmp_path / "b0", None, lambda plan: pytest.fail("asked again"))
    assert again["already_clean"] and not again["marked"] and again["shutdown_id"] == result["shutdown_id"]


def test_mark_clean_not_confirmed_writes_nothing(tmp_path):
    make_store(tmp_path / "b0", 3)
    assert not mark_clean_store(tmp_path / "b0", None, lambda plan: False)["marked"]
    assert read_status(tmp_path / "b0").state == "dirty"


def test_mark_clean_signs_a_store_made_before_store_status(tmp_path):
    position = make_store(tmp_path / "b0", 2, cluster="cid-old", status=False)
    result = mark_clean_store(tmp_path / "b0" / "state", "cid-old", lambda plan: True)
    assert result["marked"] and result["wrote_status"]
    status = read_status(tmp_path / "b0")
    assert status.cluster_id == "cid-old" and status.clean and status.position == position


def test_mark_clean_refusals(tmp_path):
    make_store(tmp_path / "b0", 2)
    lock = DataDirLock(tmp_path / "b0")
    lock.acquire()
    try:
        with pytest.raises(DataDirInUse, match="in use"):
            mark_clean_store(tmp_path / "b0", None, lambda plan: True)
    finally:
        lock.release()
    with pytest.raises(BrokerError, match="not cid-b"):
        mark_clean_store(tmp_path / "b0", "cid-b", lambda plan: True)
    write_status(tmp_path / "b0", StoreStatus("cid-z", 1.0))
    with pytest.raises(BrokerError, match="of another cluster"):
        mark_clean_store(tmp_path / "b0", None, lambda plan: True)
    (tmp_path / "e").mkdir()
    with pytest.raises(BrokerError, match="holds no state store"):
        mark_clean_store(tmp_path / "e", None, lambda plan: True)
    with pytest.raises(BrokerError, match="does not exist"):
        mark_clean_store(tmp_path / "nope", None, lambda plan: True)
    assert read_status(tmp_path / "b0").state == "dirty"


def test_mark_clean_refuses_a_store_whose_records_do_not_hash_to_its_digest(tmp_path):
    make_store(tmp_path / "b0", 0)
    store = StateStore(tmp_path / "b0" / "state", map_size=MAP)
    store.apply_batch(
        [event("TaskSubmitted", task_id="m", queue="q", payload=b"MARKER-xyz-0123456789", now_ms=5)], (1, 1)
    )
    store.close()
    mdb = tmp_path / "b0" / "state" / "data.mdb"
    data = bytearray(mdb.read_bytes())
    data[data.index(b"MARKER-xyz") + 3] ^= 1
    mdb.write_bytes(bytes(data))
    assert read_store(tmp_path / "b0")["error"] is None  # the cheap checks cannot see it
    with pytest.raises(BrokerError, match="records hash to"):
        mark_clean_store(tmp_path / "b0", None, lambda plan: True)
    assert read_status(tmp_path / "b0").state == "dirty"
    assert "records hash to" in read_store(tmp_path / "b0", full_verify=True)["error"]
