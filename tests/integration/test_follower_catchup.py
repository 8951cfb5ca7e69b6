"""A follower behind a long history reads and applies it in batches, then one entry at a time.

Real ZooKeeper and bookies; the history is written as a leader writes it (one
ledger per epoch, StateDigest events every 200 entries) while a leader-side
store applies each entry. A FollowerTail on an empty store catches up: it must
end at the leader's position and digest with far fewer store transactions than
entries (and no StateDigest mismatch on the way), and once caught up apply a
newly committed entry alone.
"""

from __future__ import annotations

import time

import pytest

from bench.leader_history import LeaderHistory
from broker.server.store.follower import FollowerTail
from broker.state.events import encode_batch
from broker.state.store import StateStore
from tests.support.ledgers import make_client, start_bookies, wait_registered

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ENTRIES = 450  # across two ledgers, two StateDigest events among them
WAIT_S = 60.0


class CountingStore:
    """The follower's store, counting the entries of each transaction it applies."""

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self.transactions: list[int] = []

    def __getattr__(self, name):
        return getattr(self._store, name)

    def apply_batches(self, entries, validated=False):
        results = self._store.apply_batches(entries, validated)
        self.transactions.append(len(results))
        return results


def _submits(n: int, now: int) -> list[dict]:
    return [
        {"type": "TaskSubmitted", "task_id": f"t{now}-{i}", "queue": "q", "payload": b"x" * 40, "now_ms": now}
        for i in range(n)
    ]


def _wait(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {WAIT_S}s")
        time.sleep(0.05)


def test_a_follower_catches_up_in_batches_and_then_applies_one_entry_alone(cluster, procs, tmp_path):
    start_bookies(procs, cluster, 3)
    wait_registered(cluster, 3)
    client = make_client(cluster, add_timeout=10.0, read_timeout=10.0, request_timeout=10.0)
    fatal: list = []
    with (
        StateStore(tmp_path / "leader", sync=False) as leader,
        StateStore(tmp_path / "follower", sync=False) as mine,
    ):
        history = LeaderHistory(client, cluster.paths, leader)
        history.start_epoch(1, broker_id=1, now_ms=1_000)
        for i in range(ENTRIES // 2):
            history.append(_submits(5, 1_000 + i))
        history.close_ledger()
        history.start_epoch(2, broker_id=1, now_ms=5_000)
        for i in range(ENTRIES // 2):
            history.append(_submits(5, 5_000 + i))
        writer = history.end_ledger()
        store = CountingStore(mine)
        tail = FollowerTail(client, store, on_fatal=fatal.append, batch=500)
        tail.start()
        try:
            _wait(lambda: mine.position() == leader.position() or fatal, "the follower did not catch up")
            assert not fatal, fatal
            assert mine.digest() == leader.digest() and mine.diverged() is None
            assert sum(store.transactions) == history.entries
            assert len(store.transactions) < history.entries // 20, store.transactions
            assert max(store.transactions) >= 64
            caught_up = len(store.transactions)
            # One more entry in the open ledger, as the leader writes it: applied, then added.
            events, position = _submits(1, 9_000), (writer.ledger_id, history.last_position[1] + 1)
            leader.apply_batch(events, position)
            assert writer.add_sync(encode_batch(events)) == position[1]
            _wait(lambda: mine.position() == leader.position(), "the new entry was not applied")
            assert store.transactions[caught_up:][-1] == 1  # applied alone, not held for a batch
            assert mine.digest() == leader.digest()
        finally:
            tail.stop()
            tail.join(10)
            writer.close()
            client.close()
