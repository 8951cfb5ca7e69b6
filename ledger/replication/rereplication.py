"""Re-replication (AutoRecovery) of CLOSED ledgers whose bookies are lost.

A closed ledger's entries sit, fragment by fragment, on the first
``write_quorum`` members of each fragment's ensemble (the writer sends every
entry to those). When a member is gone for good, its copies are lost and the
entries it held live on fewer than ``write_quorum`` bookies. Re-replication:

1. decides, purely (:mod:`ledger.replication.plan`), which fragments hold
   entries on a lost member and which live bookie replaces each lost member
   there: the placement rules of :mod:`ledger.placement`, never a bookie
   already in that fragment (by id or by ``host:port``);
2. copies each such fragment's entries from the surviving members (each copy's
   digest verified, another replica read if it is corrupt) to the replacement
   with ``add_batch`` and ``recovery: true`` (what recovery uses: a bookie stores
   those whether or not the ledger is fenced), throttled by a :class:`TokenBucket`
   (``rereplication_max_bytes_per_s``);
3. CASes the new fragments into the metadata, only if its version is unchanged
   (otherwise reads it again and redoes the plan: copying twice is harmless,
   the entries are identical);
4. deletes the ``underreplicated/<ledger>`` mark.

Only CLOSED ledgers: the open ledger's writer changes its own ensemble
(:mod:`ledger.client.ensemble_change`).

Example::

    rereplicate_ledger(zk, paths, pool, 7, digest, throttle=TokenBucket(50e6))
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass
from typing import Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from ledger import LedgerError
from ledger.client.bookie_pool import BookiePool
from ledger.codec import CorruptEntry, Digest, decode_entry
from ledger.metadata import (
    CLOSED,
    LedgerMetadata,
    MetadataConflict,
    NoSuchLedger,
    cas_metadata,
    live_bookies,
    read_metadata,
)
from ledger.replication.plan import Replacement, plan_rereplication, replaced_metadata

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0
BATCH_ENTRIES = 256  # entries per add_batch sent to a replacement
BATCH_BYTES = 4 << 20  # ... or fewer, once this many bytes are gathered


class RereplicationError(LedgerError):
    """A fragment could not be copied (no valid replica, replacement refused): retried later."""


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


def _read_copy(
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


def _read_window(
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
        out.append(_read_copy(pool, addresses, sources[1:], ledger_id, entry_id, digest, timeout))
    return out


def copy_fragment(
    pool: BookiePool,
    addresses: dict[str, str],
    meta: LedgerMetadata,
    r: Replacement,
    digest: Digest,
    throttle: TokenBucket | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> int:
    """Copy the entries of ``r``'s fragment to ``r.replacement``; return the bytes copied.

    Reads from the fragment's surviving holders (the first ``write_quorum``
    members, lost ones excluded); writes ``add_batch`` with ``recovery: true``.
    """
    if not r.copy:
        return 0
    members = meta.fragments[r.fragment]["ensemble"][: meta.write_quorum]
    sources = [m for m in members if m["bookie_id"] != r.lost["bookie_id"] and m["bookie_id"] in addresses]
    if not sources:
        raise RereplicationError(
            f"ledger {meta.ledger_id}: no surviving replica of entries {r.first_entry}..{r.last_entry}"
        )
    target = r.replacement
    target_address = addresses.get(target["bookie_id"], target["address"])
    copied = 0
    entry_id = r.first_entry
    while entry_id <= r.last_entry:
        window = range(entry_id, min(r.last_entry, entry_id + BATCH_ENTRIES - 1) + 1)
        datas = _read_window(pool, addresses, sources, meta.ledger_id, window, digest, timeout)
        # Cut the window into batches of at most BATCH_BYTES (at least one entry each).
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
                    target_address,
                    "add_batch",
                    timeout=timeout,
                    ledger=meta.ledger_id,
                    first=window[start],
                    entries=datas[start:end],
                    recovery=True,
                    bookie=target["bookie_id"],
                ).result(timeout + 1.0)
            except (LedgerError, TimeoutError) as exc:
                raise RereplicationError(
                    f"ledger {meta.ledger_id}: bookie {target['bookie_id']} refused entries "
                    f"{window[start]}..{window[end - 1]}: {exc}"
                ) from None
            copied += size
            start = end
        entry_id = window[-1] + 1
    return copied


@dataclass
class RereplicationResult:
    ledger_id: int
    replaced: list[tuple[int, str, str]]  # (fragment first entry, lost bookie id, replacement bookie id)
    bytes_copied: int
    entries_copied: int


def clear_mark(zk: KazooClient, paths: ClusterPaths, ledger_id: int) -> None:
    """Delete ``underreplicated/<ledger>`` if it is there."""
    try:
        zk.delete(paths.underreplicated_ledger(ledger_id))
    except NoNodeError:
        pass


def rereplicate_ledger(
    zk: KazooClient,
    paths: ClusterPaths,
    pool: BookiePool,
    ledger_id: int,
    digest: Digest,
    throttle: TokenBucket | None = None,
    rng: random.Random | None = None,
    lost_ids: Iterable[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    max_rounds: int = 10,
    clock: Clock = SYSTEM_CLOCK,
) -> RereplicationResult:
    """Bring every fragment of closed ``ledger_id`` back to ``write_quorum`` live bookies; clear its mark.

    ``lost_ids`` (default: every member not registered under ``bookies/``, and every
    one being decommissioned) are the members to replace. The new fragments are CASed only if the metadata did not
    change since it was read; otherwise the plan is made again (up to
    ``max_rounds`` times). Raises :class:`RereplicationError` (or
    :class:`NotEnoughBookies`) when it cannot finish; the mark then stays. ``clock`` times the log line.
    """
    rng = rng or random.Random()
    lost_arg = set(lost_ids) if lost_ids is not None else None
    total = RereplicationResult(ledger_id, [], 0, 0)
    for _ in range(max_rounds):
        try:
            meta, version = read_metadata(zk, paths, ledger_id)
        except NoSuchLedger:
            clear_mark(zk, paths, ledger_id)  # deleted (retention): nothing left to protect
            return total
        if meta.state != CLOSED:
            raise RereplicationError(
                f"ledger {ledger_id} is {meta.state}: only closed ledgers are re-replicated "
                f"(its writer or recovery handles it)"
            )
        bookies = live_bookies(zk, paths)
        plan = plan_rereplication(meta, bookies, rng, lost_ids=lost_arg)
        if not plan:
            clear_mark(zk, paths, ledger_id)
            return total
        # Where each live bookie is registered now; the lost ones are never read from.
        addresses = {
            str(b["bookie_id"]): str(b["address"])
            for b in bookies
            if b.get("address") and str(b["bookie_id"]) not in (lost_arg or ())
        }
        started = clock.monotonic()
        for r in plan:
            copied = copy_fragment(pool, addresses, meta, r, digest, throttle, timeout)
            total.bytes_copied += copied
            if r.copy:
                total.entries_copied += r.last_entry - r.first_entry + 1
        try:
            cas_metadata(zk, paths, replaced_metadata(meta, plan), version)
        except MetadataConflict:
            log.info("ledger %d: its metadata changed during re-replication; planning again", ledger_id)
            continue
        except NoSuchLedger:
            clear_mark(zk, paths, ledger_id)
            return total
        total.replaced.extend((r.first_entry, r.lost["bookie_id"], r.replacement["bookie_id"]) for r in plan)
        log.info(
            "ledger %d re-replicated: %s; %d entries (%d bytes) in %.2f s",
            ledger_id,
            ", ".join(f"{lost} -> {new} from entry {first}" for first, lost, new in total.replaced),
            total.entries_copied,
            total.bytes_copied,
            clock.monotonic() - started,
        )
        if lost_arg is not None:  # the named bookies may still be live: the next plan would not be empty
            clear_mark(zk, paths, ledger_id)
            return total
        # Otherwise look once more: the plan should now be empty, which clears the mark.
    raise RereplicationError(f"ledger {ledger_id}: the metadata kept changing during re-replication")
