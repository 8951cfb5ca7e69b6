"""Garbage collection by metadata: which local ledgers a bookie deletes, and how it hands deletions over."""

from __future__ import annotations

import threading

import pytest
from kazoo.exceptions import ConnectionLoss, NodeExistsError, NoNodeError

from election.paths import ClusterPaths
from ledger import LedgerError
from ledger.bookie.config import BookieConfig
from ledger.bookie.gc import GarbageCollector, Handoff, disowned
from ledger.metadata import CLOSED, IN_RECOVERY, OPEN, LedgerMetadata
from tests.support.clock import FakeClock

ME = "bookie-me"


def member(bookie_id: str) -> dict:
    return {"bookie_id": bookie_id, "address": f"tcp://{bookie_id}:3181"}


def meta(ledger_id: int, state: str, *ensembles: list[str]) -> LedgerMetadata:
    fragments = [
        {"first_entry": 10 * i, "ensemble": [member(b) for b in ids]} for i, ids in enumerate(ensembles)
    ]
    return LedgerMetadata(
        ledger_id, list(fragments[-1]["ensemble"]), 3, 2, state, last_entry=40, fragments=fragments
    ).validate()


def test_closed_and_not_named_is_deleted():
    metas = {5: meta(5, CLOSED, ["a", "b", "c"])}
    assert disowned([5], metas, ME, newest_ledger_id=9) == [
        (5, "its closed metadata no longer names this bookie")
    ]


def test_named_only_in_an_old_fragment_is_kept():
    metas = {5: meta(5, CLOSED, ["a", ME, "c"], ["a", "b", "c"])}
    assert disowned([5], metas, ME, newest_ledger_id=9) == []


@pytest.mark.parametrize("state", [OPEN, IN_RECOVERY])
def test_open_and_in_recovery_ledgers_are_kept_even_when_not_named(state):
    assert disowned([5], {5: meta(5, state, ["a", "b", "c"])}, ME, newest_ledger_id=9) == []


def test_no_metadata_and_older_than_the_newest_is_deleted():
    assert disowned([3], {3: None}, ME, newest_ledger_id=9) == [
        (3, "it has no metadata and ledger 9 is newer")
    ]


@pytest.mark.parametrize("newest", [9, 7, None])
def test_no_metadata_and_not_older_than_every_existing_ledger_is_kept(newest):
    assert disowned([9], {9: None}, ME, newest_ledger_id=newest) == []


def test_unknown_metadata_is_kept_and_results_come_in_id_order():
    metas = {7: None, 2: meta(2, CLOSED, ["a", "b", "c"]), 4: meta(4, CLOSED, [ME, "b", "c"])}
    assert [ledger for ledger, _ in disowned([7, 6, 4, 2, 2], metas, ME, newest_ledger_id=8)] == [2, 7]


# ---------------------------------------------------------------- the handoff to the serving loop


def test_handoff_runs_calls_in_the_owner_thread_and_passes_errors_back():
    handoff = Handoff()
    ran_in = []
    results = []

    def caller():
        results.append(handoff.call(lambda: ran_in.append(threading.current_thread()) or 7, timeout=5))
        try:
            handoff.call(lambda: 1 / 0, timeout=5)
        except ZeroDivisionError:
            results.append("raised")

    thread = threading.Thread(target=caller)
    thread.start()
    while thread.is_alive():
        handoff.run_pending()
        thread.join(0.01)
    assert results == [7, "raised"] and ran_in == [threading.current_thread()]


def test_a_call_that_timed_out_never_runs_later_and_a_closed_handoff_fails_at_once():
    handoff = Handoff(clock=FakeClock())  # the owner never runs it: the fake time passes the timeout at once
    ran = []
    with pytest.raises(TimeoutError):
        handoff.call(lambda: ran.append(1), timeout=10)
    handoff.run_pending()
    assert ran == []
    handoff.close()
    with pytest.raises(TimeoutError):
        handoff.call(lambda: ran.append(2), timeout=5)
    assert ran == [] and not handoff


# ---------------------------------------------------------------- the collector against a fake ZooKeeper


class FakeZk:
    """The few kazoo calls the collector makes, over a dict of nodes; ``on_create`` runs inside create."""

    def __init__(self, nodes: dict[str, bytes]) -> None:
        self.nodes = dict(nodes)
        self.on_create = None
        self.fail = False

    def get_children(self, path):
        if self.fail:
            raise ConnectionLoss()
        return [p[len(path) + 1 :] for p in self.nodes if p.rsplit("/", 1)[0] == path]

    def get(self, path):
        if path not in self.nodes:
            raise NoNodeError()
        return self.nodes[path], type("Stat", (), {"version": 1})()

    def create(self, path, value=b"", ephemeral=False, makepath=False):
        if path in self.nodes:
            raise NodeExistsError()
        self.nodes[path] = value
        if self.on_create:
            self.on_create(path)

    def delete(self, path):
        del self.nodes[path]


PATHS = ClusterPaths("gc")


def collector(zk: FakeZk, local: list[int], deleted: list[int]) -> GarbageCollector:
    def delete(ledger_id):
        local.remove(ledger_id)
        deleted.append(ledger_id)
        return 3

    return GarbageCollector(zk, PATHS, ME, lambda: list(local), delete, Handoff(), interval_s=60)


def test_collector_decides_again_under_the_lock_and_releases_it(caplog):
    disowned_meta, named_meta = meta(1, CLOSED, ["a", "b", "c"]), meta(2, CLOSED, ["a", "b", "c"])
    zk = FakeZk(
        {
            PATHS.ledger(1): disowned_meta.to_json(),
            PATHS.ledger(2): named_meta.to_json(),
            PATHS.ledger(4): meta(4, OPEN, [ME, "b", "c"]).to_json(),
        }
    )

    def copied_here_meanwhile(path):  # a re-replication onto this bookie finished before our lock
        if path == PATHS.rereplication_lock(2):
            zk.nodes[PATHS.ledger(2)] = meta(2, CLOSED, ["a", ME, "c"]).to_json()

    zk.on_create = copied_here_meanwhile
    local, deleted = [1, 2, 3, 4, 5], []
    with caplog.at_level("INFO", logger="ledger.bookie.gc"):
        assert collector(zk, local, deleted).collect_once(inline=True) == [1, 3]
    assert local == [2, 4, 5] and deleted == [1, 3]
    assert not [p for p in zk.nodes if p.startswith(PATHS.rereplication_locks)]
    assert (
        "garbage-collected ledger 1 (3 entries): its closed metadata no longer names this bookie"
        in caplog.text
    )


def test_collector_skips_a_locked_ledger_and_logs_a_zookeeper_failure_once(caplog):
    zk = FakeZk(
        {PATHS.ledger(1): meta(1, CLOSED, ["a", "b", "c"]).to_json(), PATHS.rereplication_lock(1): b"worker"}
    )
    local, deleted = [1], []
    gc = collector(zk, local, deleted)
    assert gc.collect_once(inline=True) == [] and local == [1]
    zk.fail = True
    with caplog.at_level("WARNING", logger="ledger.bookie.gc"):
        assert gc.collect_once(inline=True) == []
        assert gc.collect_once(inline=True) == []
    assert caplog.text.count("garbage collection skipped a pass") == 1
    zk.fail = False
    del zk.nodes[PATHS.rereplication_lock(1)]
    assert gc.collect_once(inline=True) == [1] and zk.nodes.get(PATHS.rereplication_lock(1)) is None


@pytest.mark.parametrize("value", [0, -1.0, True, "60"])
def test_gc_interval_must_be_a_positive_number_of_seconds(value):
    with pytest.raises(LedgerError, match="gc_interval_s"):
        BookieConfig(gc_interval_s=value).validate()
