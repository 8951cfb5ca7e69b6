"""A history written straight to ledgers the way a leader writes it (``bench catchup``, ``bench pipeline``).

A leader starts each epoch on a new ledger, appended to the log with a CAS on its
version, whose first entry is an ``EpochStarted``. It applies every batch to its
own store before adding it, and now and then (every ``DIGEST_EVERY_ENTRIES``
entries, the broker's default ``digest_every_entries``) puts a ``StateDigest`` of
that store at the head of a batch, so that followers can check theirs at that
position. :class:`LeaderHistory` does the same with the ledger client and a
leader-side :class:`~broker.state.store.StateStore`, keeping up to
``WRITE_INFLIGHT`` adds outstanding; the benchmarks only choose the events.

Example::

    history = LeaderHistory(client, paths, leader_store)
    for epoch, count in enumerate(entries_per_ledger(1_000, 2), start=1):
        history.start_epoch(epoch, broker_id=1, now_ms=now)
        for _ in range(count):
            history.append(events)
        history.close_ledger()   # end_ledger() leaves it OPEN, as the current leader's
    history.entries, history.events, history.ledger_ids
"""

from __future__ import annotations

from bench.common import BenchError
from broker.state.events import encode_batch
from broker.state.schema import STORE_FORMAT

DIGEST_EVERY_ENTRIES = 200  # the broker's default digest_every_entries
WRITE_INFLIGHT = 32  # ledger adds outstanding while writing the history


def entries_per_ledger(entries: int, ledgers: int) -> list[int]:
    """``entries`` spread over ``ledgers`` as evenly as they go (the first ledgers take the remainder)."""
    return [entries // ledgers + (1 if i < entries % ledgers else 0) for i in range(ledgers)]


def new_epoch_ledger(client, paths, epoch: int):
    """A writer on a new ledger of ``epoch``, appended to the log as a new leader does (CAS on the log)."""
    from ledger.log import append_ledger, read_log

    writer = client.create(epoch=epoch)
    _, version = read_log(client.zk, paths)
    append_ledger(client.zk, paths, writer.ledger_id, epoch, version)
    return writer


def settle(pending: list) -> None:
    """Wait for each ``(entry_id, future)`` add; each must commit as the entry it was sent as."""
    for entry_id, fut in pending:
        got = fut.result(30.0)
        if got != entry_id:
            raise BenchError(f"entry committed as {got}, expected {entry_id}")


class LeaderHistory:
    """Writes epochs of entries to ledgers as a leader does (see the module docstring).

    Counts what it wrote: ``entries``, ``events`` (digests and ``EpochStarted``
    included), ``bytes`` (encoded entries), ``ledger_ids``, ``last_position`` and ``last_entry``
    (its events, a due ``StateDigest`` included, and apply's results).
    """

    def __init__(self, client, paths, store) -> None:
        self._client = client
        self._paths = paths
        self._store = store
        self._writer = None
        self._next_entry = 0
        self._pending: list = []
        self._since_digest = 0
        self.entries = 0
        self.events = 0
        self.bytes = 0
        self.ledger_ids: list[int] = []
        self.last_position: tuple[int, int] | None = None
        # The last appended entry's events and apply's results, a due StateDigest included.
        self.last_entry: tuple[list[dict], list[dict]] = ([], [])

    def start_epoch(self, epoch: int, broker_id: int, now_ms: int) -> None:
        """Open a ledger of ``epoch`` on the log and write its first entry, the ``EpochStarted``."""
        self._writer = new_epoch_ledger(self._client, self._paths, epoch)
        self.ledger_ids.append(self._writer.ledger_id)
        self._next_entry = 0
        self._add([{"type": "EpochStarted", "epoch": epoch, "broker_id": broker_id, "now_ms": now_ms}])

    def append(self, events: list[dict]) -> list[dict]:
        """Write one entry of ``events`` (after a due ``StateDigest``); apply's result for each."""
        batch = list(events)
        self._since_digest += 1
        if self._since_digest >= DIGEST_EVERY_ENTRIES:
            self._since_digest = 0
            batch.insert(0, {"type": "StateDigest", "digest": self._store.digest(), "format": STORE_FORMAT})
        results = self._add(batch)
        self.last_entry = (batch, results)
        return results[len(batch) - len(events) :]

    def _add(self, batch: list[dict]) -> list[dict]:
        position = (self._writer.ledger_id, self._next_entry)
        results = self._store.apply_batch(batch, position)
        refused = next((r for r in results if not r.get("ok")), None)
        if refused is not None:
            raise BenchError(f"the leader-side store refused an event at {position}: {refused}")
        data = encode_batch(batch)
        self._pending.append((self._next_entry, self._writer.add(data)))
        self._next_entry += 1
        self.entries += 1
        self.events += len(batch)
        self.bytes += len(data)
        self.last_position = position
        if len(self._pending) >= WRITE_INFLIGHT:
            settle(self._pending[: WRITE_INFLIGHT // 2])
            del self._pending[: WRITE_INFLIGHT // 2]
        return results

    def end_ledger(self):
        """Wait until every add of the current ledger is committed; its writer, still OPEN."""
        settle(self._pending)
        self._pending = []
        writer, self._writer = self._writer, None
        return writer

    def close_ledger(self) -> None:
        """End the current ledger and close it, as the next epoch's leader would have (recovered) it."""
        self.end_ledger().close()
