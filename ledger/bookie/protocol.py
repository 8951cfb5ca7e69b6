"""The bookie's request protocol: its operations and the checks of their fields.

Pure functions over decoded request maps (no socket, no store), so the server's
handlers only act; a field that is missing or out of range raises
:class:`~election.wire.WireError` (``bad_request``), a badly framed entry
:class:`~ledger.codec.CorruptEntry` (``bad_entry``).

Example::

    ledger, first, entries, lac, recovery = parse_add_batch(msg)

Protocol (request fields -> reply fields; the envelope is ``election.wire``)::

    ping                                     -> bookie_id, cluster_id
    add      ledger, entry, data[, recovery] -> ledger, entry        errors: fenced, bad_entry
    add_batch ledger, first, entries[, recovery]
                                             -> ledger, first, count errors: fenced, bad_entry, bad_request
    read     ledger, entry                   -> data                 errors: no_entry, unknown
    read_lac ledger                          -> lac, last_entry, fenced  errors: unknown
    wait_lac ledger, after, timeout_ms[, max_entries]
                                             -> lac, last_entry, fenced[, entries]
                                                (``after``: -1 or an entry id; the reply comes
                                                once lac > after, or at the deadline; with max_entries,
                                                ``entries`` holds the stored entries after..lac, at most
                                                that many: a tailing reader needs no separate read)
    write_lac ledger, lac                    -> lac, last_entry, fenced  (explicit LAC from an idle writer)
    fence    ledger                          -> lac, last_entry, fenced=True   errors: unknown, readonly
    delete   ledger                          -> {}
    stats                                    -> adds, reads, bad_requests, batches, ledgers, entries, uptime_s,
                                                bookie_id, readonly, disk_full_events, readonly_refusals,
                                                limbo_ledgers, unknown_replies, verified_at_start, the
                                                journal's journal_syncs, journal_groups, journal_records,
                                                journal_bytes, checkpoints, replayed_records, journal_at and
                                                checkpoint_at ([file, offset]), and the
                                                serving kernel's requests, internal_errors, forbidden

Adds (``add``, ``add_batch``) also fail with ``readonly`` while the disk is full.

``unknown`` ("cannot vouch") is the answer for a ledger in limbo (see
:mod:`ledger.bookie.integrity`): to a read of an entry the bookie does not
hold, and to ``read_lac``/``wait_lac``/``write_lac``/``fence`` (a fence is
still persisted). It is never ``no_entry``, which recovery counts as evidence.

Any request may name the bookie it is meant for (``bookie``, optional); another
bookie answers ``wrong_bookie``. Recovery and readers name it, so a bookie
re-registered under a new id on the address of a lost one is never taken for
it (its empty "no such entry" would otherwise count as the old bookie's).

``recovery`` (optional, default false) marks a re-replication add made by ledger
recovery; like BookKeeper's recovery adds it is accepted on a fenced ledger.

``add_batch`` is the writer's hot path: ``entries`` is a list of 1 to
``MAX_ADD_BATCH`` encoded entries of ``ledger`` with ids ``first``,
``first + 1``, ... in order. The whole list goes into the turn's group commit
and gets ONE reply once it is durable (``count`` = entries stored), so a
pipelined writer pays one frame per bookie per batch instead of one per entry.
It is all or nothing: a list that is not a list of bytes, is empty or too long
(``bad_request``), or holds an entry whose header does not name
``ledger``/``first + i`` or is badly framed (``bad_entry``) is refused before
anything is stored; on a fenced ledger every entry is refused (``fenced``)
unless ``recovery`` is true. ``add`` stays for single adds (ledger recovery).

``write_lac`` is BookKeeper's explicit LAC: a writer that has gone idle tells
the bookies how far it has committed, since the LAC piggybacked on each add
always trails by one entry and readers must not wait for the next add to see
the last one. It is kept in memory only: after a restart the piggybacked LAC
(and, for a dead writer, recovery) covers the same ground.
"""

from __future__ import annotations

from election import wire
from ledger.codec import CorruptEntry, check_run, peek_header

OPS = frozenset(
    {"ping", "add", "add_batch", "read", "read_lac", "wait_lac", "write_lac", "fence", "delete", "stats"}
)
MAX_ADD_BATCH = 10_000  # entries in one add_batch request
_U64_MAX = (1 << 64) - 1
_I64_MAX = (1 << 63) - 1


def entity_id(msg: dict, name: str) -> int:
    """``msg[name]`` as a ledger or entry id: an integer in [0, 2^64)."""
    value = wire.field(msg, name, int)
    if not 0 <= value <= _U64_MAX:
        raise wire.WireError(wire.E_BAD_REQUEST, f"field {name!r} must be in [0, 2^64)", msg.get("rid"))
    return value


def info_fields(info: dict | None) -> dict:
    """The ``lac, last_entry, fenced`` reply fields of a ledger record (or of none)."""
    info = info or {"fenced": False, "lac": -1, "last_entry": -1}
    return {"lac": info["lac"], "last_entry": info["last_entry"], "fenced": bool(info["fenced"])}


def recovery_flag(msg: dict) -> bool:
    recovery = msg.get("recovery", False)
    if not isinstance(recovery, bool):
        raise wire.WireError(wire.E_BAD_REQUEST, "field 'recovery' must be a bool", msg["rid"])
    return recovery


def parse_add(msg: dict) -> tuple[int, int, bytes, int, bool]:
    """``(ledger, entry, data, lac, recovery)`` of an ``add``; the header must name ledger/entry."""
    ledger, entry = entity_id(msg, "ledger"), entity_id(msg, "entry")
    data = wire.field(msg, "data", bytes)
    recovery = recovery_flag(msg)
    header = peek_header(data)
    if header[:2] != (ledger, entry):
        raise CorruptEntry(f"header says ledger {header[0]} entry {header[1]}, request says {ledger}/{entry}")
    return ledger, entry, data, header[2], recovery


def parse_add_batch(msg: dict) -> tuple[int, int, list, int, bool]:
    """``(ledger, first, entries, lac, recovery)`` of an ``add_batch``, every entry checked."""
    ledger, first = entity_id(msg, "ledger"), entity_id(msg, "first")
    entries = wire.field(msg, "entries", list)
    recovery = recovery_flag(msg)
    if not 1 <= len(entries) <= MAX_ADD_BATCH:
        raise wire.WireError(
            wire.E_BAD_REQUEST,
            f"'entries' must hold 1 to {MAX_ADD_BATCH} entries, got {len(entries)}",
            msg["rid"],
        )
    if first + len(entries) - 1 > _U64_MAX:
        raise wire.WireError(wire.E_BAD_REQUEST, "entry ids would pass 2^64", msg["rid"])
    return ledger, first, entries, check_run(entries, ledger, first), recovery


MAX_PIGGYBACK_ENTRIES = 1000
# Entries that ride on a wait_lac reply stop at this many bytes (at least one is sent).
MAX_PIGGYBACK_BYTES = 1 << 20


def parse_wait_lac(msg: dict) -> tuple[int, int, int, int]:
    """``(ledger, after, timeout_ms, max_entries)`` of a ``wait_lac`` (``max_entries`` 0 when absent)."""
    ledger = entity_id(msg, "ledger")
    after, timeout_ms = wire.field(msg, "after", int), wire.field(msg, "timeout_ms", int)
    # ``after`` is an entry id or -1 (nothing yet): entries after it may be read back for the reply.
    if not -1 <= after <= _I64_MAX or timeout_ms < 0:
        raise wire.WireError(
            wire.E_BAD_REQUEST,
            "'after' must be -1 or an entry id below 2^63 and 'timeout_ms' >= 0",
            msg["rid"],
        )
    max_entries = msg.get("max_entries", 0)
    if type(max_entries) is not int or not 0 <= max_entries <= MAX_PIGGYBACK_ENTRIES:
        raise wire.WireError(
            wire.E_BAD_REQUEST, f"'max_entries' must be an int in 0..{MAX_PIGGYBACK_ENTRIES}", msg["rid"]
        )
    return ledger, after, timeout_ms, max_entries
