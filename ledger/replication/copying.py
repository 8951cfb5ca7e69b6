"""Copying entries between bookies for re-replication: verified reads, batched recovery adds, a throttle.

Each entry is read from the first source that has a valid copy (its digest
verified and its ids checked; a corrupt copy is logged and another source
read) and sent to the target with ``add_batch`` and ``recovery: true`` (a
bookie stores those whether or not the ledger is fenced, as recovery does), at
most :data:`BATCH_ENTRIES` entries or :data:`BATCH_BYTES` bytes per request,
paced by a :class:`TokenBucket`. Nothing reaches the target before every entry
of its batch was read and verified. Used to move a fragment to a replacement
(:mod:`ledger.replication.rereplication`) and to give a registered bookie the
entries it lacks (:mod:`ledger.replication.catch_up`).

Example::

    copy_entries(pool, addresses, sources, 7, range(0, 100), target, digest, throttle=TokenBucket(50e6))
"""

from __future__ import annotations

import logging
import threading
from typing import Sequence

from election.local.clock import SYSTEM_CLOCK, Clock
from ledger import LedgerError
from ledger.client.bookie_pool import BookiePool
from ledger.codec import CorruptEntry, Digest, decode_entry

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0
BATCH_ENTRIES = 256  # entries per add_batch sent to a target
BATCH_BYTES = 4 << 20  # ... or fewer, once this many bytes are gathered


class RereplicationError(LedgerError):
    """Entries could not be copied (no valid replica, the target refused or cannot be probed): retried later."""


class TokenBucket:
    """At most ``rate`` bytes per second on average, bursts up to ``burst`` (default one second's worth).

    ``rate <= 0`` means unlimited. It measures and waits on ``clock``.
    A request larger than the bucket goes through once the bucket is full and
    leaves it in debt, so the average still holds.
    """

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(rate, 1.0))
        self._clock = clock
        self._tokens = self.burst
        self._at = clock.monotonic()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self._clock.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def delay_for(self, n: int) -> float:
        """How long ``acquire(n)`` would wait now (no tokens taken)."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            self._refill()
            need = min(float(n), self.burst)
            return max(0.0, (need - self._tokens) / self.rate)

    def acquire(self, n: int) -> float:
        """Take ``n`` tokens, sleeping as needed; return the time slept."""
        if self.rate <= 0:
            return 0.0
        slept = 0.0
        while True:
            with self._lock:
                self._refill()
                need = min(float(n), self.burst)
                if self._tokens >= need:
                    self._tokens -= n
                    return slept
                wait = (need - self._tokens) / self.rate
            self._clock.sleep(wait)
            slept += wait


# ------------------------------------------------------------------ copying


def read_copy(
    pool: BookiePool,
    addresses: dict[str, str],
    sources: list[dict],
    ledger_id: int,
    entry_id: int,
    digest: Digest,
    timeout: float,
) -> bytes:
    """A verified copy of one entry from the first source that has a valid one."""
    problems = []
    for member in sources:
        try:
            reply = pool.request(
                addresses[member["bookie_id"]],
                "read",
                timeout=timeout,
                ledger=ledger_id,
                entry=entry_id,
                bookie=member["bookie_id"],
            ).result(timeout + 1.0)
            data = bytes(reply["data"])
            entry = decode_entry(data, digest)
            if (entry.ledger_id, entry.entry_id) != (ledger_id, entry_id):
                raise CorruptEntry(f"holds ledger {entry.ledger_id} entry {entry.entry_id}")
            return data
        except CorruptEntry as exc:
            log.warning(
                "re-replication of ledger %d: entry %d on bookie %s is corrupt (%s); trying another",
                ledger_id,
                entry_id,
                member["bookie_id"],
                exc.reason,
            )
            problems.append(f"{member['bookie_id']}: corrupt")
        except (LedgerError, KeyError, TypeError, TimeoutError) as exc:
            problems.append(f"{member['bookie_id']}: {exc}")
    raise RereplicationError(
        f"ledger {ledger_id} entry {entry_id}: no valid copy to re-replicate "
        f"({'; '.join(problems) or 'no surviving replica'})"
    )


def read_window(
    pool: BookiePool,
    addresses: dict[str, str],
    sources: list[dict],
    ledger_id: int,
    entries: range,
    digest: Digest,
    timeout: float,
) -> list[bytes]:
    """Verified copies of ``entries``: asked of the first source in parallel, the others for what failed."""
    first = sources[0]
    futures = [
        pool.request(
            addresses[first["bookie_id"]],
            "read",
            timeout=timeout,
            ledger=ledger_id,
            entry=e,
            bookie=first["bookie_id"],
        )
        for e in entries
    ]
    out = []
    for entry_id, fut in zip(entries, futures):
        try:
            data = bytes(fut.result(timeout + 1.0)["data"])
            entry = decode_entry(data, digest)
            if (entry.ledger_id, entry.entry_id) != (ledger_id, entry_id):
                raise CorruptEntry(f"holds ledger {entry.ledger_id} entry {entry.entry_id}")
            out.append(data)
            continue
        except CorruptEntry as exc:
            log.warning(
                "re-replication of ledger %d: entry %d on bookie %s is corrupt (%s); trying another",
                ledger_id,
                entry_id,
                first["bookie_id"],
                exc.reason,
            )
        except (LedgerError, KeyError, TypeError, TimeoutError):
            pass
        out.append(read_copy(pool, addresses, sources[1:], ledger_id, entry_id, digest, timeout))
    return out


def consecutive_runs(entry_ids: Sequence[int]) -> list[range]:
    """``entry_ids`` (ascending) as runs of consecutive ids. Pure.

    Example: ``consecutive_runs([3, 4, 5, 9, 11, 12])`` is ``[range(3, 6), range(9, 10), range(11, 13)]``.
    """
    runs: list[range] = []
    for entry_id in entry_ids:
        if runs and runs[-1].stop == entry_id:
            runs[-1] = range(runs[-1].start, entry_id + 1)
        else:
            runs.append(range(entry_id, entry_id + 1))
    return runs


def copy_entries(
    pool: BookiePool,
    addresses: dict[str, str],
    sources: list[dict],
    ledger_id: int,
    entry_ids: Sequence[int],
    target: dict,
    digest: Digest,
    throttle: TokenBucket | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> int:
    """Copy ``entry_ids`` (ascending) of ``ledger_id`` from ``sources`` to ``target``; return the bytes copied.

    ``addresses`` maps bookie ids to where they are registered now (a source
    missing from it is never read). Raises :class:`RereplicationError` when an
    entry has no valid copy or the target refuses a batch.
    """
    if not sources:
        raise RereplicationError(f"ledger {ledger_id}: no surviving replica to copy entries from")
    target_address = addresses.get(target["bookie_id"], target["address"])
    copied = 0
    for run in consecutive_runs(entry_ids):
        for start in range(run.start, run.stop, BATCH_ENTRIES):
            window = range(start, min(run.stop, start + BATCH_ENTRIES))
            datas = read_window(pool, addresses, sources, ledger_id, window, digest, timeout)
            copied += _send_window(pool, target, target_address, ledger_id, window, datas, throttle, timeout)
    return copied


def _send_window(
    pool: BookiePool,
    target: dict,
    address: str,
    ledger_id: int,
    window: range,
    datas: list[bytes],
    throttle: TokenBucket | None,
    timeout: float,
) -> int:
    """Send ``datas`` (entries ``window``) to ``target`` in batches of at most :data:`BATCH_BYTES`."""
    copied = 0
    start = 0
    while start < len(datas):
        end, size = start, 0
        while end < len(datas) and (end == start or size + len(datas[end]) <= BATCH_BYTES):
            size += len(datas[end])
            end += 1
        if throttle is not None:
            throttle.acquire(size)
        try:
            pool.request(
                address,
                "add_batch",
                timeout=timeout,
                ledger=ledger_id,
                first=window[start],
                entries=datas[start:end],
                recovery=True,
                bookie=target["bookie_id"],
            ).result(timeout + 1.0)
        except (LedgerError, TimeoutError) as exc:
            raise RereplicationError(
                f"ledger {ledger_id}: bookie {target['bookie_id']} refused entries "
                f"{window[start]}..{window[end - 1]}: {exc}"
            ) from None
        copied += size
        start = end
    return copied
