"""Whether a bookie can vouch for its store: start-up checks and the verification after a crash.

A bookie's "no such entry" is evidence in ledger recovery: two of them end a
ledger. A bookie must therefore never answer it from a store that lost data.
Three layers (docs/architecture.md, "Bookies and group commit": "a bookie vouches for its data or stays
silent"; BookKeeper's cookie, data-integrity check and limbo ledgers):

1. :func:`open_vouched_store` refuses to start on a data file that is missing
   while the cookie says it existed, empty, shorter than LMDB's own meta pages
   say it must be (checked with plain reads BEFORE LMDB maps the file: a mapped
   page past the end of the file is a SIGBUS, not an exception), unreadable,
   or stamped with another instance id than the cookie's. The refusal is one
   line that ends with the command re-registering the bookie under a new id.
2. After an unclean stop (no clean-shutdown marker), :func:`verify_store`
   checks every entry's framing and, where the digest is CRC32C, the digest
   itself (an HMAC needs the cluster secret, which bookies do not hold), and
   that each ledger's record agrees with its entries. Damaged entries are
   dropped and their ledger put in limbo.
3. For a ledger in limbo the bookie answers ``unknown`` (never ``no_entry``)
   to reads of entries it does not hold, and to ``read_lac``/``wait_lac``/
   ``fence``/``write_lac``; recovery does not count such a bookie.

Example::

    store, cookie = open_vouched_store(config, cookie)   # raises StoreRefused
    if not store.was_clean():
        report = verify_store(store)                     # logs and quarantines damage
    store.clear_clean()
"""

from __future__ import annotations

import logging
import os
import shlex
import uuid
from dataclasses import dataclass, field

import crc32c
import lmdb

from election.local.clock import SYSTEM_CLOCK, Clock
from election.local.lmdb_file import UNREADABLE, LmdbFileDamaged, MetaFacts, read_meta_facts
from ledger import LedgerError
from ledger.bookie.config import BookieConfig
from ledger.bookie.cookie import write_cookie
from ledger.bookie.store import BookieStore
from ledger.codec import CRC32C_SIZE, HEADER, HEADER_SIZE, CorruptEntry, peek_header

log = logging.getLogger(__name__)

DATA_FILE = "data.mdb"

# The reasons a bookie refuses its store (stable words, also in the one-line error).
# EMPTY, TRUNCATED and UNREADABLE are the data file's own kinds of damage (election.local.lmdb_file).
MISSING, FOREIGN = "missing", "instance_mismatch"
_WARN_LIMIT = 20  # damaged entries named per ledger in one WARNING


class StoreRefused(LedgerError):
    """The bookie cannot vouch for its data directory; ``reason`` is one of the constants above."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def check_data_file(path: str) -> MetaFacts:
    """Check ``path`` (a data.mdb) with plain reads; raise StoreRefused (EMPTY/TRUNCATED/UNREADABLE)."""
    try:
        return read_meta_facts(path)
    except LmdbFileDamaged as exc:
        raise StoreRefused(exc.kind, str(exc)) from None


def reregister_command(config: BookieConfig, bookie_id: str) -> str:
    """The commands that set the data directory aside and start this bookie as a new one."""
    data = config.data.rstrip("/") or config.data
    new_id = f"{bookie_id[:120]}-{uuid.uuid4().hex[:6]}"
    aside = f"{data}.unvouched-{uuid.uuid4().hex[:6]}"
    start = [
        "fencepost",
        "bookie",
        "start",
        "--data",
        data,
        "--bookie-id",
        new_id,
        "--listen",
        config.listen,
        "--zk",
        config.zk,
        "--cluster",
        config.cluster,
    ]
    return f"mv {shlex.quote(data)} {shlex.quote(aside)} && {shlex.join(start)}"


def refusal(config: BookieConfig, bookie_id: str, reason: str, what: str) -> StoreRefused:
    """The one-line refusal to start, ending with the commands that re-register the bookie."""
    return StoreRefused(
        reason,
        f"bookie {bookie_id} refuses to start: {what}; it cannot vouch for the entries "
        f"it acknowledged, so it must not answer for them. Its copies are restored "
        f"by recovery from the other bookies. To re-register it as a new bookie, run: "
        f"{reregister_command(config, bookie_id)}",
    )


def open_vouched_store(config: BookieConfig, cookie: dict) -> tuple[BookieStore, dict]:
    """Open the store of ``config.data`` if it is the one the cookie vouches for; stamp a fresh one.

    Returns the store and the cookie (with its ``instance_id`` set). A cookie
    without an instance id is a first start: the store is stamped first and
    the cookie second, so a crash in between is retried, never refused.
    """
    bookie_id = cookie["bookie_id"]
    path = os.path.join(config.data, DATA_FILE)
    instance = cookie.get("instance_id")
    if instance is None:
        if os.path.exists(path):
            check_or_raise(config, bookie_id, path)
        store = _open(config, bookie_id)
        stamped = store.instance_id()
        if stamped is None and store.records():
            store.close()
            raise refusal(
                config,
                bookie_id,
                FOREIGN,
                f"{config.data} holds ledgers but neither its cookie nor its store names an instance id",
            )
        instance = stamped or uuid.uuid4().hex
        if stamped is None:
            store.set_instance_id(instance)
        cookie = {**cookie, "instance_id": instance}
        write_cookie(config.data, cookie)
        return store, cookie
    if not os.path.exists(path):
        raise refusal(
            config,
            bookie_id,
            MISSING,
            f"{path} is missing although the cookie of instance "
            f"{instance} says this directory held its entries",
        )
    check_or_raise(config, bookie_id, path)
    store = _open(config, bookie_id)
    stamped = store.instance_id()
    if stamped is None and not store.created:
        # A store from before instance ids: adopt it, but verify it as after a crash.
        log.warning(
            "bookie store %s carries no instance id (made by an older version): stamping %s and verifying it",
            config.data,
            instance,
        )
        store.set_instance_id(instance)
        store.clear_clean()
        return store, cookie
    if stamped != instance:
        store.close()
        found = "no instance id (a new, empty store)" if stamped is None else f"instance {stamped}"
        raise refusal(
            config, bookie_id, FOREIGN, f"{path} holds {found}, but its cookie names instance {instance}"
        )
    return store, cookie


def check_or_raise(config: BookieConfig, bookie_id: str, path: str) -> None:
    try:
        check_data_file(path)
    except StoreRefused as exc:
        raise refusal(config, bookie_id, exc.reason, str(exc)) from None


def _open(config: BookieConfig, bookie_id: str) -> BookieStore:
    try:
        # No sync per commit: the journal makes adds durable (ledger.bookie.journal).
        return BookieStore(config.data, map_size=config.map_size_bytes, sync=False)
    except (LedgerError, lmdb.Error) as exc:
        raise refusal(config, bookie_id, UNREADABLE, f"its store cannot be opened ({exc})") from None


# -- verification after an unclean stop ----------------------------------------------------


def check_entry(ledger: int, entry: int, data: bytes) -> str | None:
    """Why a stored entry cannot be vouched for, or None: framing, key, and a CRC32C digest."""
    try:
        h_ledger, h_entry, _lac, _epoch, length = peek_header(data)
    except CorruptEntry as exc:
        return exc.reason
    if (h_ledger, h_entry) != (ledger, entry):
        return f"header names ledger {h_ledger} entry {h_entry}"
    if len(data) - HEADER_SIZE - length == CRC32C_SIZE:
        body = data[:-CRC32C_SIZE]
        if crc32c.crc32c(body).to_bytes(4, "big") != data[-CRC32C_SIZE:]:
            return "bad crc32c digest"
    return None


@dataclass
class _LedgerScan:
    last_entry: int = -1
    lac: int = -1
    damaged: dict[int, str] = field(default_factory=dict)


@dataclass
class VerifyReport:
    """What :func:`verify_store` found: entries checked, damaged ones, and the ledgers put in limbo."""

    entries: int = 0
    damaged: dict[int, dict[int, str]] = field(default_factory=dict)  # ledger -> entry -> reason
    limbo: dict[int, str] = field(default_factory=dict)  # ledger -> reason


def judge(scans: dict[int, _LedgerScan], records: dict[int, dict]) -> dict[int, str]:
    """Which ledgers go to limbo and why, from the entries' scan and the stored records (pure)."""
    limbo: dict[int, str] = {}
    for ledger in sorted(set(scans) | set(records)):
        scan, record = scans.get(ledger), records.get(ledger)
        if scan is not None and scan.damaged:
            ids = sorted(scan.damaged)
            shown = ", ".join(map(str, ids[:_WARN_LIMIT])) + (" ..." if len(ids) > _WARN_LIMIT else "")
            limbo[ledger] = f"{len(ids)} damaged entries ({shown})"
        elif record is None:
            limbo[ledger] = "entries without a ledger record"
        elif scan is None and (record["lac"], record["last_entry"]) != (-1, -1):
            limbo[ledger] = f"record says last entry {record['last_entry']} but no entry is stored"
        elif scan is not None and record["last_entry"] != scan.last_entry:
            limbo[ledger] = f"record says last entry {record['last_entry']}, entries end at {scan.last_entry}"
        elif scan is not None and record["lac"] != scan.lac:
            limbo[ledger] = f"record says LAC {record['lac']}, the entries say {scan.lac}"
    return limbo


def verify_store(store: BookieStore) -> VerifyReport:
    """Check every entry and record; drop damaged entries and put their ledgers in limbo."""
    report = VerifyReport()
    scans: dict[int, _LedgerScan] = {}
    try:
        for ledger, entry, data in store.scan():
            report.entries += 1
            scan = scans.get(ledger)
            if scan is None:
                scan = scans[ledger] = _LedgerScan()
            scan.last_entry = max(scan.last_entry, entry)
            reason = check_entry(ledger, entry, data)
            if reason is not None:
                scan.damaged[entry] = reason
            else:
                scan.lac = max(scan.lac, HEADER.unpack_from(data)[2])
        records = store.records()
    except lmdb.Error as exc:
        raise StoreRefused(UNREADABLE, f"the store {store.path} is damaged: {exc}") from None
    already = store.limbo()
    for ledger, reason in judge(scans, records).items():
        damaged = scans[ledger].damaged if ledger in scans else {}
        if damaged:
            report.damaged[ledger] = damaged
            for entry, why in sorted(damaged.items())[:_WARN_LIMIT]:
                log.warning(
                    "ledger %d entry %d is damaged on this bookie (%s): dropped, never served",
                    ledger,
                    entry,
                    why,
                )
        report.limbo[ledger] = reason
        if ledger not in already or damaged:
            store.quarantine(ledger, reason, sorted(damaged))
        log.warning("ledger %d is in limbo on this bookie: %s; it answers 'unknown' for it", ledger, reason)
    return report


def prepare_store(
    config: BookieConfig, bookie_id: str, store: BookieStore, clock: Clock = SYSTEM_CLOCK
) -> dict[int, dict]:
    """Verify the store if the last stop was unclean, then clear the clean-shutdown marker.

    Returns the ledgers in limbo (``{ledger: {reason, dropped}}``), which the
    bookie answers ``unknown`` for. Raises StoreRefused when LMDB reports
    damage while reading, and LedgerError when the marker cannot be cleared.
    """
    if not store.was_clean():
        log.warning("bookie %s was not shut down cleanly: verifying its store before serving", bookie_id)
        started = clock.monotonic()
        try:
            report = verify_store(store)
        except StoreRefused as exc:
            raise refusal(config, bookie_id, exc.reason, str(exc)) from None
        log.warning(
            "bookie %s verified %d entries in %.1f s: %d damaged, %d ledgers in limbo",
            bookie_id,
            report.entries,
            clock.monotonic() - started,
            sum(map(len, report.damaged.values())),
            len(report.limbo),
        )
    try:
        store.clear_clean()
    except lmdb.Error as exc:
        raise LedgerError(
            f"bookie {bookie_id} cannot clear its clean-shutdown marker in {config.data} ({exc}): "
            f"free disk space or raise map_size_bytes, then start it again"
        ) from None
    return store.limbo()
