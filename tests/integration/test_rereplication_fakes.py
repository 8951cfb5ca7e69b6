"""Re-replication against in-process fake bookies and a real ZooKeeper: conflicts, corrupt copies, deletion,
a registered bookie caught up in place."""

from __future__ import annotations

import json

import pytest

from election import wire
from ledger.client.bookie_pool import BookiePool
from ledger.codec import Digest, Entry, decode_entry, encode_entry
from ledger.metadata import CLOSED, LedgerMetadata, cas_metadata, create_metadata, read_metadata
from ledger.replication.copying import RereplicationError
from ledger.replication.rereplication import rereplicate_ledger
from ledger.replication.underreplication import mark_underreplicated, read_underreplicated
from tests.support.ledgers import FakeBookie, entries_seen, register

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

DIGEST = Digest.crc32c()
N = 20


class Holder:
    """A fake bookie holding ``entries`` of one ledger (bytes per id); ``corrupt`` ids answer damaged bytes."""

    def __init__(
        self, ledger_id_box: list, entries: range = range(0), corrupt: frozenset = frozenset(), on_add=None
    ):
        self.box = ledger_id_box
        self.entries = set(entries)
        self.corrupt = corrupt
        self.on_add = on_add
        self.stores = False  # whether an add_batch makes it hold the entries (a bookie that is read back)
        self.vouches = True  # False: reads answer ``unknown`` (it cannot vouch for the ledger)

    def __call__(self, msg):
        if msg["op"] == "read":
            if not self.vouches:
                return wire.error_reply(msg["rid"], "unknown", "cannot vouch for it")
            e = msg["entry"]
            if e not in self.entries:
                return wire.error_reply(msg["rid"], "no_entry", "no such entry")
            data = bytearray(encode_entry(Entry(self.box[0], e, e - 1, 1, b"p%d" % e), DIGEST))
            if e in self.corrupt:
                data[-1] ^= 0xFF
            return wire.ok_reply(msg["rid"], data=bytes(data))
        if msg["op"] == "add_batch":
            if self.on_add is not None:
                self.on_add(msg)
            if self.stores:
                self.entries.update(range(msg["first"], msg["first"] + len(msg["entries"])))
            return wire.ok_reply(
                msg["rid"], ledger=msg["ledger"], first=msg["first"], count=len(msg["entries"])
            )
        return wire.ok_reply(msg["rid"])


@pytest.fixture
def env(cluster):
    created = []
    pool = BookiePool(default_timeout=2.0)

    def make(handlers, lacking_from: int | None = None):
        """Fakes fake-0.. and a closed ledger on the first three, its third member marked.

        The third member is ``gone`` (not registered: lost), or with ``lacking_from`` fake-2 itself,
        marked from that entry (a registered bookie the writer replaced after entries it missed).
        """
        box = [None]
        fakes = [FakeBookie(h(box)) for h in handlers]
        created.extend(fakes)
        for i, fake in enumerate(fakes):
            register(cluster, fake, f"fake-{i}", free_gib=10 + i)
        ensemble = [{"bookie_id": f"fake-{i}", "address": fakes[i].address} for i in range(3)]
        if lacking_from is None:
            ensemble[2] = {"bookie_id": "gone", "address": "tcp://127.0.0.1:1"}  # not registered: lost
        meta = LedgerMetadata(-1, ensemble, 3, 2, CLOSED, N - 1, epoch=2)
        ledger_id, _ = create_metadata(cluster.zk, cluster.paths, meta)
        box[0] = ledger_id
        mark_underreplicated(
            cluster.zk, cluster.paths, ledger_id, [ensemble[2]], from_entry=lacking_from or 0, by="test"
        )
        return ledger_id, fakes

    yield cluster, pool, make
    pool.close()
    for fake in created:
        fake.close()


def test_a_metadata_change_during_the_copy_makes_it_plan_again(env):
    cluster, pool, make = env
    bumped = []

    def bump(msg):
        if not bumped:  # someone else rewrites the metadata while we copy (same content, new version)
            bumped.append(1)
            meta, version = read_metadata(cluster.zk, cluster.paths, msg["ledger"])
            cas_metadata(cluster.zk, cluster.paths, meta, version)

    ledger_id, fakes = make(
        [lambda b: Holder(b, range(N)), lambda b: Holder(b, range(N)), lambda b: Holder(b, on_add=bump)]
    )
    result = rereplicate_ledger(cluster.zk, cluster.paths, pool, ledger_id, DIGEST, timeout=2.0)
    assert result.replaced == [(0, "gone", "fake-2")]
    assert sorted(entries_seen(fakes[2])) == sorted(list(range(N)) * 2)  # copied twice: once per plan
    meta, _ = read_metadata(cluster.zk, cluster.paths, ledger_id)
    assert [m["bookie_id"] for m in meta.ensemble] == ["fake-0", "fake-1", "fake-2"]
    assert read_underreplicated(cluster.zk, cluster.paths, ledger_id) is None


def test_a_corrupt_copy_is_read_from_another_replica_and_none_valid_fails(env):
    cluster, pool, make = env
    ledger_id, fakes = make(
        [
            lambda b: Holder(b, range(N), corrupt=frozenset({3, 7})),
            lambda b: Holder(b, range(N), corrupt=frozenset({7})),
            lambda b: Holder(b),
        ]
    )
    with pytest.raises(RereplicationError, match="entry 7"):
        rereplicate_ledger(cluster.zk, cluster.paths, pool, ledger_id, DIGEST, timeout=2.0)
    assert read_underreplicated(cluster.zk, cluster.paths, ledger_id) is not None  # stays for a later try
    assert read_metadata(cluster.zk, cluster.paths, ledger_id)[0].ensemble[2]["bookie_id"] == "gone"
    assert entries_seen(fakes[2]) == []  # nothing sent before every copy was verified

    fakes[1].handler.corrupt = frozenset()  # a good copy of entry 7 appears
    result = rereplicate_ledger(cluster.zk, cluster.paths, pool, ledger_id, DIGEST, timeout=2.0)
    assert result.replaced == [(0, "gone", "fake-2")]
    copies = [m for m in fakes[2].seen if m["op"] == "add_batch"]
    assert copies and all(m["recovery"] is True for m in copies)
    sent = [e for m in copies for e in m["entries"]]
    assert [decode_entry(d, DIGEST).payload for d in sent] == [b"p%d" % e for e in range(N)]  # 3 and 7 good


def test_a_deleted_ledger_only_loses_its_mark(env):
    cluster, pool, make = env
    ledger_id, _ = make([lambda b: Holder(b, range(N))] * 3)
    cluster.zk.delete(cluster.paths.ledger(ledger_id))
    result = rereplicate_ledger(cluster.zk, cluster.paths, pool, ledger_id, DIGEST, timeout=2.0)
    assert result.replaced == [] and read_underreplicated(cluster.zk, cluster.paths, ledger_id) is None


def test_an_open_ledger_is_refused(env, cluster):
    _, pool, make = env
    ledger_id, _ = make([lambda b: Holder(b, range(N))] * 3)
    meta, version = read_metadata(cluster.zk, cluster.paths, ledger_id)
    doc = json.loads(meta.to_json())
    doc["state"] = "OPEN"
    cluster.zk.set(cluster.paths.ledger(ledger_id), json.dumps(doc).encode(), version=version)
    with pytest.raises(RereplicationError, match="only closed"):
        rereplicate_ledger(cluster.zk, cluster.paths, pool, ledger_id, DIGEST, timeout=2.0)


def test_a_registered_bookie_gets_the_entries_it_lacks_and_keeps_its_place(env):
    cluster, pool, make = env
    ledger_id, fakes = make(
        [lambda b: Holder(b, range(N)), lambda b: Holder(b, range(N)), lambda b: Holder(b, range(12))], 8
    )
    fakes[2].handler.stores = True
    before, _ = read_metadata(cluster.zk, cluster.paths, ledger_id)
    result = rereplicate_ledger(cluster.zk, cluster.paths, pool, ledger_id, DIGEST, timeout=2.0)
    assert result.caught_up == [("fake-2", N - 12)] and result.replaced == []
    copies = [m for m in fakes[2].seen if m["op"] == "add_batch"]
    assert all(m["recovery"] is True for m in copies)
    sent = [e for m in copies for e in m["entries"]]
    assert [decode_entry(d, DIGEST).entry_id for d in sent] == list(range(12, N))  # only what it lacked
    probed = sorted(m["entry"] for m in fakes[2].seen if m["op"] == "read")
    assert probed == sorted([*range(8, N), *range(12, N)])  # from the mark's entry on, then the copies again
    assert read_metadata(cluster.zk, cluster.paths, ledger_id)[0] == before  # it keeps its place
    assert read_underreplicated(cluster.zk, cluster.paths, ledger_id) is None


def test_a_registered_bookie_holding_everything_only_loses_its_mark(env):
    cluster, pool, make = env
    ledger_id, fakes = make([lambda b: Holder(b, range(N))] * 3, 0)
    result = rereplicate_ledger(cluster.zk, cluster.paths, pool, ledger_id, DIGEST, timeout=2.0)
    assert result.caught_up == [("fake-2", 0)] and entries_seen(fakes[2]) == []
    assert read_underreplicated(cluster.zk, cluster.paths, ledger_id) is None


def test_the_mark_stays_while_the_bookie_cannot_say_what_it_holds_or_does_not_keep_the_copies(env):
    cluster, pool, make = env
    ledger_id, fakes = make(
        [lambda b: Holder(b, range(N)), lambda b: Holder(b, range(N)), lambda b: Holder(b, range(5))], 5
    )
    fakes[2].handler.vouches = False
    with pytest.raises(RereplicationError, match="cannot tell whether bookie fake-2 holds entry 5"):
        rereplicate_ledger(cluster.zk, cluster.paths, pool, ledger_id, DIGEST, timeout=2.0)
    assert entries_seen(fakes[2]) == []
    assert read_underreplicated(cluster.zk, cluster.paths, ledger_id) is not None
    fakes[2].handler.vouches = True  # it answers now, but acknowledges copies it does not keep
    with pytest.raises(RereplicationError, match="still lacks 15 entries"):
        rereplicate_ledger(cluster.zk, cluster.paths, pool, ledger_id, DIGEST, timeout=2.0)
    assert read_underreplicated(cluster.zk, cluster.paths, ledger_id) is not None
    fakes[2].handler.stores = True
    assert rereplicate_ledger(cluster.zk, cluster.paths, pool, ledger_id, DIGEST, timeout=2.0).caught_up == [
        ("fake-2", N - 5)
    ]
    assert read_underreplicated(cluster.zk, cluster.paths, ledger_id) is None


def test_a_read_only_bookie_keeps_the_mark_until_it_has_room(env):
    cluster, pool, make = env
    ledger_id, fakes = make(
        [lambda b: Holder(b, range(N)), lambda b: Holder(b, range(N)), lambda b: Holder(b, range(5))], 5
    )
    doc = {"bookie_id": "fake-2", "address": fakes[2].address, "free_bytes": 0, "readonly": True}
    cluster.zk.set(cluster.paths.bookie("fake-2"), json.dumps(doc).encode())
    with pytest.raises(RereplicationError, match="read-only"):
        rereplicate_ledger(cluster.zk, cluster.paths, pool, ledger_id, DIGEST, timeout=2.0)
    assert entries_seen(fakes[2]) == [] and read_underreplicated(cluster.zk, cluster.paths, ledger_id)
