"""The snapshot catalog with a real StateStore: create, list, prune, restore."""

from __future__ import annotations

import contextlib
import os

import pytest

from broker.state.events import event
from broker.state.restore import restore_snapshot
from broker.state.schema import META_LOCAL
from broker.state.store import StateStore
from broker.state.store_errors import StoreIncomplete
from snapshots import SnapshotError
from snapshots.catalog import EmptyStore, RestoreRefused, SnapshotCatalog, parse_name, snapshot_name
from snapshots.format import SnapshotCorrupt, WrongCluster
from snapshots.reader import read_header
from snapshots.writer import write_snapshot

MAP = 64 << 20


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        self.t += 1.0
        return self.t


class Replica:
    def __init__(self, path):
        self.store = StateStore(path, map_size=MAP, sync=False)
        self.ledger, self.entry, self.now, self.n = 1, -1, 1_000, 0
        self.batch([event("EpochStarted", epoch=1, broker_id=0, now_ms=self.now)])

    def batch(self, events):
        self.entry += 1
        return self.store.apply_batch(events, (self.ledger, self.entry))

    def submit(self, count, queue="q"):
        evs = []
        for _ in range(count):
            self.n += 1
            self.now += 1
            evs.append(
                event(
                    "TaskSubmitted",
                    task_id=f"t{self.n}",
                    queue=queue,
                    payload=f"payload {self.n}".encode(),
                    priority=self.n % 5,
                    now_ms=self.now,
                )
            )
        assert all(r["ok"] for r in self.batch(evs))

    def work(self):
        [res] = self.batch([event("TaskLeased", worker="w1", queues=["q"], max_tasks=5, now_ms=self.now)])
        tasks = res["tasks"]
        self.batch(
            [
                event(
                    "TaskCompleted",
                    task_id=t["task_id"],
                    attempt=t["attempt"],
                    result=b"ok",
                    now_ms=self.now + 1,
                )
                for t in tasks[:3]
            ]
        )


@pytest.fixture
def replica(tmp_path):
    r = Replica(tmp_path / "state")
    for _ in range(5):
        r.submit(200)
    r.work()
    r.submit(50, queue="other")
    yield r
    r.store.close()


@pytest.fixture
def catalog(tmp_path):
    return SnapshotCatalog.in_data_dir(tmp_path / "broker")


def same_state(a: StateStore, b: StateStore):
    assert a.position() == b.position()
    assert a.digest() == b.digest() == b.recompute_digest()
    assert a.epoch() == b.epoch()
    assert a.queue_depths() == b.queue_depths()
    assert replicated(a) == replicated(b)


def replicated(store: StateStore) -> list:
    """Every record but a replica's own bookkeeping (a restored copy records its cluster id)."""
    return [r for r in store.iter_records() if not (r[0] == "meta" and r[1] in META_LOCAL)]


def test_names():
    assert snapshot_name((3, 41)) == "snap-0000000003-0000000041.fps"
    assert parse_name("snap-0000000003-0000000041.fps") == (3, 41)
    assert parse_name(snapshot_name((1 << 63, 12))) == (1 << 63, 12)
    for bad in (
        "snap-3-41.fps",
        "snap-0000000003-0000000041.fps.tmp",
        "../snap-0000000003-0000000041.fps",
        "snap-0000000003-0000000041.fps.part",
        "x",
    ):
        assert parse_name(bad) is None


def test_create_then_restore_gives_the_same_state(replica, catalog, tmp_path):
    info = catalog.create(replica.store, cluster_id="dev", broker_id=4, clock=Clock())
    assert info["name"] == snapshot_name(replica.store.position())
    assert info["position"] == list(replica.store.position())
    assert info["digest"] == replica.store.digest()
    assert info["epoch"] == 1 and info["broker_id"] == 4 and info["created_at"] == 1001.0
    assert info["existing"] is False
    assert os.path.getsize(info["path"]) == info["size"]

    header = restore_snapshot(info["path"], tmp_path / "new-state", cluster_id="dev")
    assert header["digest"] == replica.store.digest()
    with StateStore(tmp_path / "new-state", map_size=MAP) as restored:
        same_state(replica.store, restored)
        for tid in ("t1", "t2", "t500", "t1050"):
            assert restored.get_task(tid) == replica.store.get_task(tid)
        assert restored.queue_depths()["q"]["done"] == 3
        # The restored replica continues from the snapshot position.
        entry = restored.position()[1] + 1
        restored.apply_batch(
            [event("TaskSubmitted", task_id="after", queue="q", payload=b"x", now_ms=9_999_999)], (1, entry)
        )
        assert restored.get_task("after")["state"] == "waiting"


def test_create_is_idempotent_per_position(replica, catalog):
    first = catalog.create(replica.store, "dev", 4, Clock())
    again = catalog.create(replica.store, "dev", 4, Clock(5000.0))
    assert again["existing"] is True and again["checksum"] == first["checksum"]
    assert len(catalog.list()) == 1


def test_create_on_an_empty_store_is_refused(tmp_path, catalog):
    with StateStore(tmp_path / "empty", map_size=MAP, sync=False) as store:
        with pytest.raises(EmptyStore):
            catalog.create(store, "dev", 1, Clock())
    assert catalog.list() == []


def test_create_reads_one_transaction_while_writes_go_on(replica, catalog, tmp_path):
    """Batches applied while the snapshot streams do not leak into it."""
    before = (replica.store.position(), replica.store.digest())

    class Busy:
        @contextlib.contextmanager
        def snapshot_view(self):
            with replica.store.snapshot_view() as view:

                def records():
                    for i, rec in enumerate(view["records"]):
                        if i in (10, 1000):
                            replica.submit(20)  # the leader goes on writing
                        yield rec

                yield dict(view, records=records())

    info = catalog.create(Busy(), "dev", 1, Clock())
    assert (tuple(info["position"]), info["digest"]) == before
    assert replica.store.position() > before[0]
    restore_snapshot(info["path"], tmp_path / "r", cluster_id="dev")
    with StateStore(tmp_path / "r", map_size=MAP) as restored:
        assert (restored.position(), restored.digest()) == before
        assert restored.get_task(f"t{replica.n}") is None


def test_list_newest_first_with_errors_reported(replica, catalog):
    clock = Clock()
    a = catalog.create(replica.store, "dev", 1, clock)
    replica.submit(10)
    b = catalog.create(replica.store, "dev", 1, clock)
    (catalog.dir / "snap-0000000099-0000000000.fps").write_bytes(b"garbage")
    (catalog.dir / "snap-0000000098-0000000000.fps").write_bytes(
        open(a["path"], "rb").read()
    )  # a good file under the wrong name
    for ignored in ("snap-0000000097-0000000000.fps.tmp", "snap-0000000097-0000000000.fps.part", "notes.txt"):
        (catalog.dir / ignored).write_bytes(b"x")
    listing = catalog.list()
    assert [s["name"] for s in listing] == [
        "snap-0000000099-0000000000.fps",
        "snap-0000000098-0000000000.fps",
        b["name"],
        a["name"],
    ]
    assert listing[0]["error"] == "not a fencepost snapshot" and listing[0]["size"] == 7
    assert "name says position" in listing[1]["error"]
    assert listing[2]["checksum"] == b["checksum"] and "error" not in listing[2]
    assert catalog.latest_valid()["name"] == b["name"]


def test_latest_valid_skips_damaged_files(replica, catalog):
    clock = Clock()
    a = catalog.create(replica.store, "dev", 1, clock)
    replica.submit(10)
    b = catalog.create(replica.store, "dev", 1, clock)
    assert catalog.latest_valid()["name"] == b["name"]
    data = bytearray(open(b["path"], "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(b["path"], "wb") as fh:
        fh.write(data)
    st = os.stat(b["path"])
    os.utime(b["path"], ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))  # a new file version
    assert catalog.latest_valid()["name"] == a["name"]
    with pytest.raises(SnapshotCorrupt):
        catalog.verify(b["name"])
    assert catalog.latest_valid(cluster_id="other") is None
    with pytest.raises(WrongCluster):
        catalog.verify(a["name"], cluster_id="other")
    with pytest.raises(SnapshotError):
        catalog.verify("../../etc/passwd")


def make_snapshots(replica, catalog, n):
    clock, out = Clock(), []
    for _ in range(n):
        replica.submit(5)
        out.append(catalog.create(replica.store, "dev", 1, clock))
    return out


def test_prune_keeps_the_newest(replica, catalog):
    snaps = make_snapshots(replica, catalog, 5)
    deleted = catalog.prune(keep=2)
    assert sorted(deleted) == sorted(s["path"] for s in snaps[:3])
    assert [s["name"] for s in catalog.list()] == [snaps[4]["name"], snaps[3]["name"]]
    assert catalog.prune(keep=2) == []
    assert catalog.prune(keep=0) == [snaps[3]["path"]]  # keep < 1 still keeps the newest
    assert [s["name"] for s in catalog.list()] == [snaps[4]["name"]]


def test_prune_never_deletes_the_newest_valid_one(replica, catalog):
    snaps = make_snapshots(replica, catalog, 4)
    with open(snaps[3]["path"], "r+b") as fh:  # the newest is damaged
        fh.truncate(100)
    deleted = catalog.prune(keep=1)
    assert sorted(deleted) == sorted(s["path"] for s in snaps[:2])
    # The damaged newer file stays for an operator; the newest valid one stays.
    assert [s["name"] for s in catalog.list()] == [snaps[3]["name"], snaps[2]["name"]]
    assert catalog.latest_valid()["name"] == snaps[2]["name"]


def test_prune_without_any_valid_snapshot_deletes_nothing(catalog):
    catalog.dir.mkdir(parents=True)
    for i in range(3):
        (catalog.dir / snapshot_name((1, i))).write_bytes(b"FPSNAP01 broken")
    assert catalog.prune(keep=1) == []
    assert len(catalog.list()) == 3
    assert SnapshotCatalog("/nonexistent/dir").list() == []


def test_restore_refuses_a_store_with_state(replica, catalog, tmp_path):
    info = catalog.create(replica.store, "dev", 1, Clock())
    digest = replica.store.digest()
    # While the broker has it open (same process): refused, not crashed.
    with pytest.raises(RestoreRefused, match="cannot open the state store"):
        restore_snapshot(info["path"], tmp_path / "state", cluster_id="dev")
    replica.store.close()
    with pytest.raises(RestoreRefused, match="already holds state"):
        restore_snapshot(info["path"], tmp_path / "state", cluster_id="dev")
    replica.store = StateStore(tmp_path / "state", map_size=MAP)  # untouched
    assert replica.store.get_task("t1") is not None
    assert replica.store.recompute_digest() == replica.store.digest() == digest


def test_restore_into_an_existing_empty_store_dir(replica, catalog, tmp_path):
    info = catalog.create(replica.store, "dev", 1, Clock())
    StateStore(tmp_path / "fresh", map_size=MAP).close()
    restore_snapshot(info["path"], tmp_path / "fresh", cluster_id="dev")
    with StateStore(tmp_path / "fresh", map_size=MAP) as restored:
        same_state(replica.store, restored)


def test_restore_refuses_damage_and_other_clusters_touching_nothing(replica, catalog, tmp_path):
    info = catalog.create(replica.store, "dev", 1, Clock())
    with pytest.raises(WrongCluster, match="wrong cluster: snapshot is of dev, this cluster is prod"):
        restore_snapshot(info["path"], tmp_path / "r1", cluster_id="prod")
    data = bytearray(open(info["path"], "rb").read())
    data[200] ^= 1
    bad = tmp_path / "bad.fps"
    bad.write_bytes(data)
    with pytest.raises(SnapshotCorrupt):
        restore_snapshot(bad, tmp_path / "r2", cluster_id="dev")
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def test_failed_load_leaves_nothing_half_installed(replica, tmp_path):
    """An intact file whose records do not hash to its digest: the load fails midway."""
    with replica.store.snapshot_view() as view:
        recs = list(view["records"])
        header = {
            "cluster_id": "dev",
            "broker_id": 1,
            "position": list(view["position"]),
            "epoch": view["epoch"],
            "created_at": 1.0,
            "digest": view["digest"],
        }
    recs = [(db, k, v + b"!" if db == "tasks" and k == b"t7" else v) for db, k, v in recs]
    path = tmp_path / "lying.fps"
    write_snapshot(path, header, recs)
    with pytest.raises(SnapshotError, match="hash"):
        restore_snapshot(path, tmp_path / "r", cluster_id="dev")
    assert not (tmp_path / "r").exists()
    # Into a directory that existed before: the LMDB files go, the directory stays.
    (tmp_path / "keep").mkdir()
    with pytest.raises(SnapshotError):
        restore_snapshot(path, tmp_path / "keep", cluster_id="dev")
    assert list((tmp_path / "keep").iterdir()) == []


def test_restore_replaces_an_interrupted_load(replica, catalog, tmp_path):
    info = catalog.create(replica.store, "dev", 1, Clock())
    target = tmp_path / "half"
    store = StateStore(target, map_size=MAP)

    def cut():
        for i, rec in enumerate(replica.store.iter_records()):
            if i == 500:
                raise ConnectionError("killed")
            yield rec

    with pytest.raises(ConnectionError):
        store.load_records(cut())
    store.close()
    with pytest.raises(StoreIncomplete):
        StateStore(target, map_size=MAP)
    restore_snapshot(info["path"], target, cluster_id="dev")
    with StateStore(target, map_size=MAP) as restored:
        same_state(replica.store, restored)


def test_read_header_of_created_snapshot(replica, catalog):
    info = catalog.create(replica.store, "dev", 1, Clock())
    header = read_header(info["path"])
    assert header["record_count"] == sum(1 for _ in replica.store.iter_records())
