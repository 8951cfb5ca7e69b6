"""`bench ledger`'s re-replication phase: how fast a lost bookie's share of closed ledgers is copied back.

Private cluster only (it SIGKILLs one of the benchmark's own bookies, which run
without AutoRecovery so that nothing but this phase re-replicates): write
``ledgers`` closed ledgers of ``entry_size``-byte entries totalling about
``total_bytes``, SIGKILL the bookie that is a member of most of them, then call
:func:`ledger.replication.rereplication.rereplicate_ledger` by hand, unthrottled, for each
ledger it held, and time the calls together.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from typing import Callable

from bench.common import BenchError

TOTAL_BYTES = 30_000_000
ENTRY_BYTES = 64 * 1024
LEDGERS = 3
WRITE_INFLIGHT = 64


def _write_ledger(client, payload: bytes, entries: int, stop: threading.Event) -> int:
    """Create a ledger, add ``entries`` payloads (``WRITE_INFLIGHT`` outstanding), close it; its id."""
    writer = client.create(epoch=1)
    slots = threading.BoundedSemaphore(WRITE_INFLIGHT)
    errors: list[BaseException] = []

    def done(fut) -> None:
        slots.release()
        if fut.exception() is not None:
            errors.append(fut.exception())

    for _ in range(entries):
        slots.acquire()
        if errors or stop.is_set():
            slots.release()
            break
        writer.add(payload).add_done_callback(done)
    for _ in range(WRITE_INFLIGHT):  # drain
        if not slots.acquire(timeout=60):
            raise BenchError("re-replication phase: adds still outstanding after 60 s")
    writer.close()
    if errors:
        raise BenchError(f"re-replication phase: an add failed: {type(errors[0]).__name__}: {errors[0]}")
    return writer.ledger_id


def rereplication_phase(
    client,
    kill: Callable[[dict], None],
    stop: threading.Event,
    total_bytes: int = TOTAL_BYTES,
    entry_size: int = ENTRY_BYTES,
    ledgers: int = LEDGERS,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict:
    """Write, kill a member, re-replicate unthrottled; ``{"bytes", "seconds", "mb_per_s", "ledgers", ...}``."""
    from ledger.metadata import live_bookies, read_metadata
    from ledger.replication.copying import TokenBucket
    from ledger.replication.rereplication import rereplicate_ledger

    zk, paths = client.zk, client.paths
    payload = os.urandom(entry_size)
    per_ledger = max(1, total_bytes // (entry_size * ledgers))
    ids = [_write_ledger(client, payload, per_ledger, stop) for _ in range(ledgers)]
    if stop.is_set():
        raise KeyboardInterrupt
    metas = {lid: read_metadata(zk, paths, lid)[0] for lid in ids}
    counts = Counter(m["bookie_id"] for meta in metas.values() for m in meta.ensemble)
    lost_id = counts.most_common(1)[0][0]
    member = next(m for meta in metas.values() for m in meta.ensemble if m["bookie_id"] == lost_id)
    affected = [
        lid
        for lid, meta in metas.items()
        if any(m["bookie_id"] == lost_id for f in meta.fragments for m in f["ensemble"])
    ]
    progress(
        f"re-replication: {len(ids)} ledgers of {per_ledger} x {entry_size} B written; "
        f"bookie {lost_id} (in {len(affected)}) killed"
    )
    kill(member)

    unthrottled = TokenBucket(0)  # rate <= 0: unlimited
    copied = entries = 0
    t0 = time.perf_counter()
    for lid in affected:
        res = rereplicate_ledger(
            zk, paths, client.pool, lid, client.digest, throttle=unthrottled, lost_ids=[lost_id]
        )
        if not res.replaced:
            raise BenchError(f"re-replication phase: ledger {lid} had nothing re-replicated")
        copied += res.bytes_copied
        entries += res.entries_copied
    elapsed = time.perf_counter() - t0

    # The killed bookie stays registered until its ZooKeeper session expires; later phases must not pick it.
    deadline = time.monotonic() + 60
    while any(str(b["bookie_id"]) == lost_id for b in live_bookies(zk, paths)):
        if time.monotonic() > deadline or stop.is_set():
            break
        time.sleep(0.2)
    return {
        "bytes": copied,
        "entries": entries,
        "seconds": round(elapsed, 3),
        "ledgers": len(affected),
        "mb_per_s": round(copied / elapsed / 1e6, 2) if elapsed > 0 else None,
    }
