"""The bookie's LMDB store and its cookie, without sockets."""

from __future__ import annotations

import json

import pytest

from ledger import LedgerError
from ledger.bookie.config import BookieConfig
from ledger.bookie.cookie import CookieError, WrongClusterError, check_or_write_cookie, read_cookie
from ledger.bookie.store import FENCED, STORED, BookieStore
from ledger.codec import Digest, Entry, encode_entry
from tests.support.bookie_helpers import add_entries

MAP = 64 * 1024 * 1024


def entry(ledger: int, entry_id: int, lac: int = -1, payload: bytes = b"p") -> bytes:
    return encode_entry(Entry(ledger, entry_id, lac, 1, payload), Digest.crc32c())


@pytest.fixture
def store(tmp_path):
    s = BookieStore(tmp_path / "store", map_size=MAP)
    yield s
    s.close()


def test_adds_store_and_track_lac_and_last_entry(store):
    items = [(1, i, entry(1, i, lac=i - 1)) for i in range(5)] + [(2, 0, entry(2, 0))]
    assert add_entries(store, items) == [STORED] * 6
    assert store.read(1, 3) == items[3][2]
    assert store.read(1, 99) is None and store.read(77, 0) is None
    assert store.ledger_info(1) == {"fenced": False, "lac": 3, "last_entry": 4}
    assert store.ledger_info(2) == {"fenced": False, "lac": -1, "last_entry": 0}
    assert store.ledger_info(3) is None
    assert store.list_ledgers() == [1, 2]
    assert store.counts() == {"ledgers": 2, "entries": 6}


def test_lac_never_moves_back(store):
    add_entries(store, [(1, 5, entry(1, 5, lac=4))])
    add_entries(store, [(1, 2, entry(1, 2, lac=1))])  # a late retry of an older entry
    assert store.ledger_info(1) == {"fenced": False, "lac": 4, "last_entry": 5}


def test_re_adding_is_idempotent(store):
    data = entry(1, 0, payload=b"same")
    assert add_entries(store, [(1, 0, data)]) == [STORED]
    assert add_entries(store, [(1, 0, data), (1, 0, data)]) == [STORED, STORED]
    assert store.read(1, 0) == data
    assert store.counts()["entries"] == 1


def test_fence_refuses_later_adds_but_not_recovery_adds(store):
    add_entries(store, [(1, 0, entry(1, 0))])
    assert store.fence(1) == {"fenced": True, "lac": -1, "last_entry": 0}
    assert add_entries(store, [(1, 1, entry(1, 1)), (2, 0, entry(2, 0))]) == [FENCED, STORED]
    assert store.read(1, 1) is None
    assert add_entries(store, [(1, 1, entry(1, 1, lac=0), True)]) == [STORED]
    assert store.ledger_info(1) == {"fenced": True, "lac": 0, "last_entry": 1}


def test_add_runs_stores_checked_runs_in_one_transaction(store):
    run = [entry(5, i, lac=i - 1) for i in range(3, 7)]
    assert store.add_runs([(5, 3, run, 5, False), (6, 0, [entry(6, 0)], -1, False)]) == [STORED, STORED]
    assert [store.read(5, i) for i in range(3, 7)] == run
    assert store.ledger_info(5) == {"fenced": False, "lac": 5, "last_entry": 6}
    # An earlier run (a retry) overwrites and never moves lac or last_entry back.
    assert store.add_runs([(5, 0, [entry(5, 0), entry(5, 1)], -1, False)]) == [STORED]
    assert store.ledger_info(5) == {"fenced": False, "lac": 5, "last_entry": 6}
    assert store.counts() == {"ledgers": 2, "entries": 7}


def test_add_runs_on_a_fenced_ledger_store_nothing_unless_recovery(store):
    store.add_runs([(1, 0, [entry(1, 0)], -1, False)])
    store.fence(1)
    run = [entry(1, 1, lac=0), entry(1, 2, lac=0)]
    assert store.add_runs([(1, 1, run, 0, False), (2, 0, [entry(2, 0)], -1, False)]) == [FENCED, STORED]
    assert store.read(1, 1) is None and store.read(1, 2) is None
    assert store.ledger_info(1) == {"fenced": True, "lac": -1, "last_entry": 0}
    assert store.add_runs([(1, 1, run, 0, True)]) == [STORED]
    assert store.ledger_info(1) == {"fenced": True, "lac": 0, "last_entry": 2}


def test_fence_of_an_unknown_ledger_creates_its_record(store):
    assert store.fence(42) == {"fenced": True, "lac": -1, "last_entry": -1}
    assert add_entries(store, [(42, 0, entry(42, 0))]) == [FENCED]


def test_fence_and_entries_survive_reopen(tmp_path):
    path = tmp_path / "store"
    s = BookieStore(path, map_size=MAP)
    add_entries(s, [(7, i, entry(7, i, lac=i - 1)) for i in range(3)])
    s.fence(7)
    s.close()
    s = BookieStore(path, map_size=MAP)
    try:
        assert s.ledger_info(7) == {"fenced": True, "lac": 1, "last_entry": 2}
        assert s.read(7, 2) == entry(7, 2, lac=1)
        assert add_entries(s, [(7, 3, entry(7, 3))]) == [FENCED]
    finally:
        s.close()


def test_delete_ledger_removes_only_that_ledger(store):
    add_entries(store, [(led, i, entry(led, i)) for led in (1, 2, 3) for i in range(4)])
    assert store.delete_ledger(2) == 4
    assert store.read(2, 0) is None and store.ledger_info(2) is None
    assert store.read(1, 3) is not None and store.read(3, 0) is not None
    assert store.list_ledgers() == [1, 3]
    assert store.delete_ledger(2) == 0  # deleting twice is fine
    assert store.delete_ledger((1 << 64) - 1) == 0  # the last possible ledger id


def test_ids_are_checked(store):
    with pytest.raises(LedgerError):
        store.read(-1, 0)
    with pytest.raises(LedgerError):
        store.fence(1 << 64)


def test_cookie_is_written_once_and_checked(tmp_path):
    data = tmp_path / "d"
    cookie = check_or_write_cookie(data, "prod", "id-1", None, "bookie-h-1")
    assert cookie == {"cluster": "prod", "cluster_id": "id-1", "bookie_id": "bookie-h-1"}
    assert json.loads((data / "COOKIE").read_text()) == cookie
    # Later starts keep the id even if the default would now be different.
    assert check_or_write_cookie(data, "prod", "id-1", None, "bookie-h-2")["bookie_id"] == "bookie-h-1"
    assert check_or_write_cookie(data, "prod", "id-1", "bookie-h-1")["bookie_id"] == "bookie-h-1"
    with pytest.raises(CookieError, match="belongs to bookie 'bookie-h-1'"):
        check_or_write_cookie(data, "prod", "id-1", "other-id")
    assert not [p for p in data.iterdir() if p.name != "COOKIE"]  # no temp files left behind


def test_cookie_of_another_cluster_names_both(tmp_path):
    check_or_write_cookie(tmp_path, "alpha", "uuid-a", "b1")
    with pytest.raises(WrongClusterError) as info:
        check_or_write_cookie(tmp_path, "beta", "uuid-b", "b1")
    message = str(info.value)
    for word in ("alpha", "uuid-a", "beta", "uuid-b"):
        assert word in message
    # Same name, new cluster id (the cluster was re-created): still another cluster.
    with pytest.raises(WrongClusterError, match="uuid-a"):
        check_or_write_cookie(tmp_path, "alpha", "uuid-c", "b1")


def test_generated_bookie_id_and_data_without_cookie(tmp_path):
    cookie = check_or_write_cookie(tmp_path / "a", "dev", "x", None)
    assert cookie["bookie_id"].startswith("bookie-")
    BookieStore(tmp_path / "b", map_size=MAP).close()
    with pytest.raises(CookieError, match="no COOKIE"):
        check_or_write_cookie(tmp_path / "b", "dev", "x", None)


def test_corrupt_cookie_is_an_error(tmp_path):
    (tmp_path / "COOKIE").write_text("{not json")
    with pytest.raises(CookieError):
        read_cookie(tmp_path)
    (tmp_path / "COOKIE").write_text('{"cluster": "dev"}')
    with pytest.raises(CookieError, match="cluster_id"):
        read_cookie(tmp_path)


@pytest.mark.parametrize(
    "changes, word",
    [
        ({"listen": "127.0.0.1:3181"}, "listen"),
        ({"listen": "tcp://127.0.0.1:0"}, "listen"),
        ({"listen": "tcp://127.0.0.1"}, "listen"),
        ({"cluster": "no/slash"}, "cluster"),
        ({"bookie_id": "bad id"}, "bookie_id"),
        ({"max_batch": 0}, "max_batch"),
        ({"max_frame_bytes": True}, "max_frame_bytes"),
        ({"map_size_bytes": 10}, "map_size_bytes"),
        ({"fsync": "yes"}, "fsync"),
    ],
)
def test_bookie_config_validation(changes, word):
    with pytest.raises(LedgerError, match=word):
        BookieConfig(**changes).validate()


def test_bookie_config_defaults_and_default_id():
    config = BookieConfig(listen="tcp://10.1.2.3:4181").validate()
    assert config.default_bookie_id() == "bookie-10.1.2.3-4181"


def test_a_cookie_of_the_id_a_reinitialized_cluster_replaced_is_rewritten(tmp_path):
    from ledger.bookie.cookie import WrongClusterError, check_or_write_cookie, read_cookie

    check_or_write_cookie(tmp_path, "prod", "fresh-id", None, "b1")  # signed while ZooKeeper had a new id
    cookie = check_or_write_cookie(tmp_path, "prod", "stores-id", None, replaced_cluster_id="fresh-id")
    assert cookie["cluster_id"] == read_cookie(tmp_path)["cluster_id"] == "stores-id"
    with pytest.raises(WrongClusterError):
        check_or_write_cookie(tmp_path, "prod", "other-id", None, replaced_cluster_id="fresh-id")
