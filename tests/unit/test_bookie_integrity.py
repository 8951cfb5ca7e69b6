"""Whether a bookie can vouch for its store: data-file checks, verification, limbo, read-only mode,
and recovery's verdict on an entry (never "absent" on answers that cannot vouch)."""

from __future__ import annotations

import itertools
import os
import struct

import lmdb
import pytest

from election.local.lmdb_file import EMPTY, TRUNCATED, UNREADABLE, parse_meta_pages
from ledger.bookie import store as bookie_store
from ledger.bookie.config import BookieConfig
from ledger.bookie.cookie import read_cookie, write_cookie
from ledger.bookie.integrity import (
    FOREIGN,
    MISSING,
    StoreRefused,
    check_data_file,
    check_entry,
    open_vouched_store,
    prepare_store,
    verify_store,
)
from ledger.bookie.store import BookieStore, ReadOnlyGate, is_disk_full
from ledger.client.recovery import (
    ABSENT,
    CORRUPT,
    FOUND,
    HAS,
    NO_ANSWER,
    NO_ENTRY,
    UNDECIDED,
    UNVOUCHED,
    entry_verdict,
)
from ledger.codec import HEADER_SIZE, Digest, Entry, encode_entry
from tests.support.bookie_helpers import add_entries

MAP = 64 * 1024 * 1024


def entry(ledger: int, entry_id: int, lac: int = -1, payload: bytes = b"payload") -> bytes:
    return encode_entry(Entry(ledger, entry_id, lac, 1, payload), Digest.crc32c())


def config(tmp_path) -> BookieConfig:
    return BookieConfig(
        data=str(tmp_path / "bookie"),
        listen="tcp://127.0.0.1:4999",
        zk="127.0.0.1:2181",
        cluster="c1",
        map_size_bytes=MAP,
    )


def fresh(tmp_path, n: int = 50) -> tuple[BookieConfig, dict]:
    """A stamped store holding ledger 1 (entries 0..n-1), closed cleanly; its config and cookie."""
    cfg = config(tmp_path)
    write_cookie(cfg.data, {"cluster": "c1", "cluster_id": "cid", "bookie_id": "b1"})
    store, cookie = open_vouched_store(cfg, read_cookie(cfg.data))
    add_entries(store, [(1, i, entry(1, i, lac=i - 1, payload=os.urandom(300))) for i in range(n)])
    store.mark_clean()
    store.close()
    return cfg, cookie


def data_file(cfg: BookieConfig) -> str:
    return os.path.join(cfg.data, "data.mdb")


# -- the data file, before LMDB maps it --------------------------------------------------------


def test_meta_pages_give_the_size_lmdb_needs(tmp_path):
    cfg, _ = fresh(tmp_path, 2000)
    with open(data_file(cfg), "rb") as fh:
        facts = parse_meta_pages(fh.read(8192))
    assert facts.page_size == 4096 and facts.txn_id >= 2
    assert facts.needed_bytes <= os.path.getsize(data_file(cfg))
    assert check_data_file(data_file(cfg)) == facts


@pytest.mark.parametrize(
    "size, reason", [(0, EMPTY), (100, TRUNCATED), (5000, TRUNCATED), ("half", TRUNCATED)]
)
def test_short_data_files_are_named(tmp_path, size, reason):
    cfg, _ = fresh(tmp_path, 2000)
    path = data_file(cfg)
    os.truncate(path, os.path.getsize(path) // 2 if size == "half" else size)
    with pytest.raises(StoreRefused) as info:
        check_data_file(path)
    assert info.value.reason == reason


def test_garbage_is_unreadable(tmp_path):
    path = tmp_path / "data.mdb"
    path.write_bytes(os.urandom(64 * 1024))
    with pytest.raises(StoreRefused) as info:
        check_data_file(str(path))
    assert info.value.reason == UNREADABLE


# -- opening: the store must be the one the cookie vouches for ----------------------------------


def test_first_start_stamps_store_then_cookie_and_reopens(tmp_path):
    cfg, cookie = fresh(tmp_path)
    assert read_cookie(cfg.data)["instance_id"] == cookie["instance_id"]
    store, again = open_vouched_store(cfg, read_cookie(cfg.data))
    try:
        assert store.instance_id() == cookie["instance_id"] == again["instance_id"]
        assert store.was_clean()
    finally:
        store.close()


def test_a_crash_between_stamping_the_store_and_the_cookie_is_resumed(tmp_path):
    cfg = config(tmp_path)
    write_cookie(cfg.data, {"cluster": "c1", "cluster_id": "cid", "bookie_id": "b1"})
    store = BookieStore(cfg.data, map_size=MAP)
    store.set_instance_id("abc")
    store.close()
    store, cookie = open_vouched_store(cfg, read_cookie(cfg.data))
    store.close()
    assert cookie["instance_id"] == "abc" == read_cookie(cfg.data)["instance_id"]


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("delete", MISSING),
        ("empty", EMPTY),
        ("half", TRUNCATED),
        ("replace", FOREIGN),
        ("other", FOREIGN),
    ],
)
def test_a_store_the_cookie_does_not_vouch_for_is_refused_with_the_command(tmp_path, damage, reason):
    cfg, cookie = fresh(tmp_path, 2000)
    path = data_file(cfg)
    if damage == "delete":
        os.unlink(path)
    elif damage == "empty":
        os.truncate(path, 0)
    elif damage == "half":
        os.truncate(path, os.path.getsize(path) // 2)
    elif damage == "replace":  # a new, empty LMDB file in its place
        os.unlink(path)
        os.unlink(os.path.join(cfg.data, "lock.mdb"))
        lmdb.open(cfg.data, map_size=MAP).close()
    else:  # another bookie's store
        other, _ = fresh(tmp_path / "other")
        os.replace(data_file(other), path)
    with pytest.raises(StoreRefused) as info:
        open_vouched_store(cfg, cookie)
    message = str(info.value)
    assert info.value.reason == reason and "\n" not in message
    assert "bookie b1 refuses to start" in message
    assert f"fencepost bookie start --data {cfg.data} --bookie-id b1-" in message
    assert f"--listen {cfg.listen} --zk {cfg.zk} --cluster {cfg.cluster}" in message


def test_a_store_from_before_instance_ids_is_adopted_and_verified(tmp_path):
    cfg = config(tmp_path)
    old = BookieStore(cfg.data, map_size=MAP)
    add_entries(old, [(1, 0, entry(1, 0))])
    old.mark_clean()
    old.close()
    write_cookie(cfg.data, {"cluster": "c1", "cluster_id": "cid", "bookie_id": "b1", "instance_id": "i1"})
    store, _ = open_vouched_store(cfg, read_cookie(cfg.data))
    try:
        assert store.instance_id() == "i1" and not store.was_clean()
    finally:
        store.close()


# -- verification after an unclean stop ---------------------------------------------------------


def flip(cfg: BookieConfig, ledger: int, entry_id: int, offset: int = HEADER_SIZE) -> None:
    env = lmdb.open(cfg.data, max_dbs=8, map_size=MAP)
    db = env.open_db(b"entries")
    with env.begin(write=True) as txn:
        key = struct.pack(">QQ", ledger, entry_id)
        data = bytearray(txn.get(key, db=db))
        data[offset] ^= 0x01
        txn.put(key, bytes(data), db=db)
    env.close()


def test_check_entry_names_what_is_wrong():
    good = entry(4, 2)
    assert check_entry(4, 2, good) is None
    assert "digest" in check_entry(4, 2, good[:-1] + bytes([good[-1] ^ 1]))
    assert "ledger 4 entry 2" in check_entry(4, 3, good)
    assert "too short" in check_entry(4, 2, good[:10])
    hmac = encode_entry(Entry(4, 2, -1, 1, b"x"), Digest.hmac_sha256(b"secret"))
    assert check_entry(4, 2, hmac) is None  # framing only: bookies do not hold the secret


def test_a_damaged_entry_is_dropped_and_its_ledger_put_in_limbo(tmp_path, caplog):
    cfg, cookie = fresh(tmp_path)
    store, _ = open_vouched_store(cfg, cookie)
    assert prepare_store(cfg, "b1", store) == {} and not store.was_clean()  # serving: marker cleared
    add_entries(store, [(2, i, entry(2, i, lac=i - 1)) for i in range(3)])
    store.close()  # without mark_clean: a crash
    flip(cfg, 1, 17)
    store, _ = open_vouched_store(cfg, cookie)
    try:
        with caplog.at_level("WARNING"):
            limbo = prepare_store(cfg, "b1", store)
        assert set(limbo) == {1} and limbo[1]["dropped"] == [17] and "damaged" in limbo[1]["reason"]
        assert "ledger 1 entry 17 is damaged" in caplog.text and "bad crc32c digest" in caplog.text
        assert store.read(1, 17) is None and store.read(1, 18) is not None and store.read(2, 2) is not None
        assert not store.was_clean()
        store.delete_ledger(1)
        assert store.limbo() == {}
    finally:
        store.close()


def test_records_that_disagree_with_their_entries_are_limbo(tmp_path):
    cfg, cookie = fresh(tmp_path, 5)
    env = lmdb.open(cfg.data, max_dbs=8, map_size=MAP)
    import msgpack

    ledgers = env.open_db(b"ledgers")
    entries = env.open_db(b"entries")
    with env.begin(write=True) as txn:
        txn.put(
            struct.pack(">Q", 1), msgpack.packb({"fenced": False, "lac": 9, "last_entry": 10}), db=ledgers
        )
        txn.put(struct.pack(">Q", 3), msgpack.packb({"fenced": True, "lac": -1, "last_entry": 4}), db=ledgers)
        txn.put(struct.pack(">QQ", 5, 0), entry(5, 0), db=entries)  # no record
        txn.put(
            struct.pack(">Q", 6), msgpack.packb({"fenced": True, "lac": -1, "last_entry": -1}), db=ledgers
        )
    env.close()
    store = BookieStore(cfg.data, map_size=MAP)
    try:
        report = verify_store(store)
        assert set(report.limbo) == {1, 3, 5} and report.entries == 6
        assert "entries end at 4" in report.limbo[1] and "no entry is stored" in report.limbo[3]
        assert set(store.limbo()) == {1, 3, 5}
    finally:
        store.close()


# -- full disk -----------------------------------------------------------------------------------


def test_read_only_gate_changes_state_once_per_episode():
    gate = ReadOnlyGate(probe_s=1.0)
    assert gate.may_try(0.0) and not gate.succeeded()
    assert gate.failed(10.0) is True and gate.readonly and gate.events == 1
    assert not gate.may_try(10.5)
    assert gate.may_try(11.0) and gate.failed(11.0) is False and gate.events == 1
    assert gate.succeeded() is True and not gate.readonly and not gate.succeeded()
    assert gate.failed(20.0) is True and gate.events == 2


def test_a_full_map_is_recognised(tmp_path):
    store = BookieStore(tmp_path / "tiny", map_size=1 << 20)
    try:
        with pytest.raises(lmdb.MapFullError) as info:
            for i in range(10_000):
                add_entries(store, [(1, i, entry(1, i, payload=os.urandom(2000)))])
        assert is_disk_full(info.value)
        assert is_disk_full(OSError(28, "No space left on device")) and not is_disk_full(ValueError("x"))
        assert store.read(1, 0) is not None  # the failed transaction left the store as it was
    finally:
        store.close()


def test_an_io_error_on_a_nearly_full_filesystem_is_a_full_disk(tmp_path, monkeypatch):
    # LMDB reports a page write that ran out of space as EIO, not ENOSPC.
    short_write = lmdb.Error("mdb_txn_commit: Input/output error")
    assert not is_disk_full(short_write)  # no path: cannot tell, so not taken for a full disk
    assert not is_disk_full(short_write, tmp_path)  # plenty of space: a real I/O error
    monkeypatch.setattr(bookie_store, "free_bytes", lambda path: 1 << 20)
    assert is_disk_full(short_write, tmp_path)
    assert is_disk_full(OSError(5, "Input/output error"), tmp_path)
    assert not is_disk_full(lmdb.CorruptedError("mdb_get: MDB_CORRUPTED"), tmp_path)


# -- recovery's verdict on one entry -------------------------------------------------------------

ANSWERS = (HAS, NO_ENTRY, UNVOUCHED, NO_ANSWER, CORRUPT)


def test_verdict_examples():
    assert entry_verdict({0: NO_ENTRY, 1: NO_ENTRY}, {0, 1}, 2) == ABSENT
    assert entry_verdict({0: NO_ENTRY, 1: UNVOUCHED, 2: NO_ANSWER}, {0, 2}, 2) == UNDECIDED
    assert entry_verdict({0: NO_ENTRY, 1: NO_ENTRY}, {0}, 2) == UNDECIDED  # 1 is not fenced
    assert entry_verdict({0: NO_ENTRY, 1: UNVOUCHED, 2: NO_ENTRY}, {0, 1, 2}, 2) == ABSENT
    assert entry_verdict({0: CORRUPT, 1: HAS}, {0, 1}, 2) == FOUND


@pytest.mark.parametrize("ensemble, ack_quorum", [(3, 2), (3, 3), (4, 2), (5, 3)])
def test_verdict_never_drops_an_acknowledged_entry(ensemble, ack_quorum):
    """Exhaustive: whatever the answers, an entry on an ack quorum of bookies is never ABSENT.

    A bookie that holds the entry answers HAS, or (down, damaged, wiped and so
    unvouched, corrupt) anything but NO_ENTRY; that is the bookie side's promise.
    """
    fence_quorum = ensemble - ack_quorum + 1
    indices = range(ensemble)
    for answers in itertools.product(ANSWERS, repeat=ensemble):
        for fenced_size in range(fence_quorum, ensemble + 1):
            for fenced in itertools.combinations(indices, fenced_size):
                verdict = entry_verdict(dict(enumerate(answers)), set(fenced), fence_quorum)
                holders_possible = [i for i in indices if answers[i] != NO_ENTRY]
                if len(holders_possible) >= ack_quorum and HAS not in answers:
                    assert verdict != ABSENT, (answers, fenced)
                if verdict == ABSENT:
                    noes = [i for i in fenced if answers[i] == NO_ENTRY]
                    assert len(noes) >= fence_quorum and UNVOUCHED not in [answers[i] for i in noes]


def test_new_ensembles_never_take_a_read_only_bookie():
    import random

    from ledger.metadata import NotEnoughBookies, choose_ensemble

    bookies = [
        {"bookie_id": f"b{i}", "address": f"tcp://127.0.0.1:{4000 + i}", "readonly": i == 0} for i in range(4)
    ]
    for seed in range(30):
        assert "b0" not in {m["bookie_id"] for m in choose_ensemble(bookies, 3, random.Random(seed))}
    # A full disk refuses every add: a ledger waits for a writable bookie rather than start one copy short.
    with pytest.raises(NotEnoughBookies, match="found 2 .*read-only: b0"):
        choose_ensemble(bookies[:3], 3, random.Random(1))


def test_a_read_only_bookie_without_adds_probes_the_disk_itself(tmp_path):
    """New ledgers leave a read-only bookie out, so no add would ever end its read-only episode:
    its own probe commit does, once space came back (and not before)."""
    from ledger.bookie.config import BookieConfig
    from ledger.bookie.server import Bookie

    bookie = Bookie(BookieConfig(data=str(tmp_path / "b"), listen="tcp://127.0.0.1:1", zk="127.0.0.1:1"))
    from ledger.bookie.journal import Journal

    store = BookieStore(tmp_path / "tiny", map_size=1 << 20)
    bookie._store = store
    os.makedirs(tmp_path / "journal")
    bookie._journal = Journal(str(tmp_path / "journal"), "i" * 32, 1 << 16, start_seq=1, fsync=False)
    try:
        # Fill the map with big entries of ledger 1, freed at once when it is deleted.
        with pytest.raises(lmdb.MapFullError):
            for i in range(1000):
                add_entries(store, [(1, i, entry(1, i, payload=bytes(20_000)))])
        assert bookie._gate.failed(0.0)
        bookie._probe_disk(5.0)
        assert bookie._gate.readonly and not bookie._gate.may_try(5.5)  # still full: next probe in 1 s
        store.delete_ledger(1)
        bookie._probe_disk(7.0)
        assert not bookie._gate.readonly
        assert store.read(1, 0) is None and store.counts()  # the probe left nothing behind
    finally:
        bookie._journal.close()
        store.close()
