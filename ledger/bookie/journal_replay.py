"""Opening a bookie's journal at start: identity checks, replay from the checkpoint, a fresh file.

The store is written without sync between checkpoints, so after any stop the records
from the checkpoint on are applied to it again (:func:`replay`; applying them twice
gives the same store: puts overwrite with the same bytes, the LAC and last entry only
grow, a fence or a delete is idempotent). Then the store is synced, the old files are
deleted, the checkpoint moves to a new file and the file is made, so a torn tail is never
followed by new groups. On a full journal disk (no room for the new file even then) the
bookie starts read-only rather than not at all: it still serves its copies.

Where a group does not parse (:mod:`ledger.bookie.journal_format`):

* the journal ends there if nothing but zeros follows in its file (the preallocated
  rest; at the end of a rolled file the next file goes on);
* otherwise, if no valid group header follows anywhere (at a later ``ALIGN``
  boundary of the file or in a later file), it is a **torn tail**: the last group,
  whose sync never returned, so none of it was acknowledged. It is dropped, with a
  WARNING;
* otherwise it is **damage in the middle**: records after it were acknowledged, and
  the bookie stops with :class:`JournalDamaged`, one line naming the file and offset
  (it must not serve what it cannot vouch for).

Example::

    journal, report = open_journal(config, bookie_id, instance_id, store)
    report.records, report.torn   # replayed records, the torn tail dropped (or None)
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Iterator

from ledger.bookie.config import BookieConfig
from ledger.bookie.integrity import FOREIGN, MISSING, StoreRefused, refusal
from ledger.bookie.journal import (
    Journal,
    JournalError,
    delete_before,
    journal_files,
    read_state,
    write_state,
)
from ledger.bookie.journal_format import (
    ALIGN,
    GROUP_HEADER,
    GROUP_MAGIC_BYTES,
    KIND_ADD,
    KIND_DELETE,
    KIND_FENCE,
    JournalFormatError,
    Record,
    decode_file_header,
    decode_group_header,
    decode_records,
)
from ledger.bookie.store import BookieStore, is_disk_full

log = logging.getLogger(__name__)

DAMAGED = "journal_damaged"
_APPLY_RUNS = 5000  # add runs stored per transaction while replaying


class JournalDamaged(StoreRefused):
    """A journal record before acknowledged ones does not parse: the bookie cannot replay it."""

    def __init__(self, path: str, offset: int, reason: str, message: str) -> None:
        super().__init__(DAMAGED, message)
        self.path, self.offset, self.reason = path, offset, reason


@dataclass
class ReplayReport:
    groups: int = 0
    records: int = 0
    entries: int = 0
    last_group_seq: int = 0
    torn: str | None = None  # "file at offset" of a dropped torn tail
    disk_full: str | None = None  # why no journal file could be made at start (the bookie is read-only)


def _later_group(buf: bytes, after: int) -> int | None:
    """The offset of a valid group header at an ``ALIGN`` boundary after ``after``, or None."""
    at = buf.find(GROUP_MAGIC_BYTES, after + 1)
    while at != -1:
        if at % ALIGN == 0 and decode_group_header(buf, at) is not None:
            return at
        at = buf.find(GROUP_MAGIC_BYTES, at + 1)
    return None


def _has_groups(path: str) -> bool:
    with open(path, "rb") as fh:
        buf = fh.read()
    return _later_group(buf, 0) is not None


def scan(
    directory: str, instance_id: str, checkpoint: tuple[int, int], report: ReplayReport
) -> Iterator[Record]:
    """The records from ``checkpoint`` on, in order (see the module docstring for where it ends)."""
    files = sorted((seq, path) for seq, path in journal_files(directory).items() if seq >= checkpoint[0])
    for index, (seq, path) in enumerate(files):
        later = [p for _, p in files[index + 1 :]]
        with open(path, "rb") as fh:
            buf = fh.read()
        try:
            found_seq, found_instance = decode_file_header(buf[:ALIGN])
        except JournalFormatError as exc:
            if any(map(_has_groups, later)):
                raise _damaged(path, 0, exc.reason, directory) from None
            log.warning(
                "journal file %s has no valid header (%s): a roll cut short, ignored", path, exc.reason
            )
            return
        if found_instance != instance_id:
            raise JournalError(
                f"journal file {path} belongs to store instance {found_instance}, not {instance_id}: "
                f"this journal directory is another bookie's"
            )
        if found_seq != seq:
            raise _damaged(path, 0, f"its header says file {found_seq}", directory)
        offset = max(checkpoint[1], ALIGN) if seq == checkpoint[0] else ALIGN
        while True:
            head = decode_group_header(buf, offset)
            reason = "no valid group header"
            if head is not None:
                try:
                    records = list(decode_records(buf, offset + GROUP_HEADER.size, head))
                except JournalFormatError as exc:
                    reason = exc.reason
                else:
                    report.groups += 1
                    report.last_group_seq = head.seq
                    yield from records
                    offset += head.size
                    continue
            if not buf[offset:].strip(b"\0"):
                break  # the unwritten rest of the file: go on with the next one
            if _later_group(buf, offset) is not None or any(map(_has_groups, later)):
                raise _damaged(path, offset, reason, directory)
            report.torn = f"{path} at offset {offset}"
            log.warning(
                "journal %s ends in a torn group at offset %d (%s): dropped (it was never acknowledged)",
                path,
                offset,
                reason,
            )
            return


def _damaged(path: str, offset: int, reason: str, directory: str) -> JournalDamaged:
    return JournalDamaged(
        path,
        offset,
        reason,
        f"journal file {path} is damaged at offset {offset} ({reason}) and acknowledged records "
        f"follow it: the bookie cannot replay its journal, so it must not serve. Move {directory} "
        f"aside to keep it for inspection; the bookie's copies are restored by recovery from the others",
    )


def apply(store: BookieStore, records: Iterator[Record], report: ReplayReport) -> None:
    """Apply journal records to the store in order (idempotent), add runs batched per transaction."""
    runs: list[tuple] = []

    def flush() -> None:
        if runs:
            store.add_runs(runs)  # recovery runs: what the journal holds was stored, fenced or not
            runs.clear()

    for record in records:
        report.records += 1
        if record.kind == KIND_ADD:
            report.entries += len(record.entries)
            runs.append((record.ledger, record.first, record.entries, record.lac, True))
            if len(runs) >= _APPLY_RUNS:
                flush()
            continue
        flush()
        if record.kind == KIND_FENCE:
            store.fence(record.ledger)
        elif record.kind == KIND_DELETE:
            store.delete_ledger(record.ledger)
    flush()


def replay(directory: str, instance_id: str, checkpoint: tuple[int, int], store: BookieStore) -> ReplayReport:
    """Apply every record from ``checkpoint`` on to ``store``; raise JournalDamaged on damage in the middle."""
    report = ReplayReport()
    apply(store, scan(directory, instance_id, checkpoint, report), report)
    return report


def open_journal(
    config: BookieConfig, bookie_id: str, instance_id: str, store: BookieStore
) -> tuple[Journal, ReplayReport]:
    """Check the journal directory, replay it into the store, start a new file and checkpoint there.

    Raises StoreRefused (another instance's journal, or none where acknowledged entries may
    be only in the journal) and JournalDamaged.
    """
    directory = config.journal_path()
    os.makedirs(directory, exist_ok=True)
    state = read_state(directory)
    files = journal_files(directory)
    report = ReplayReport()
    if state is None:
        if files:
            raise refusal(config, bookie_id, FOREIGN, f"{directory} holds journal files but no JOURNAL state")
        if store.journal_backed() and not store.was_clean():
            raise refusal(
                config,
                bookie_id,
                MISSING,
                f"its journal is missing from {directory} although its store was written with one and "
                f"was not closed cleanly (acknowledged entries since the last checkpoint were only there)",
            )
    elif state["instance_id"] != instance_id:
        raise refusal(
            config,
            bookie_id,
            FOREIGN,
            f"the journal in {directory} belongs to store instance {state['instance_id']}, not {instance_id}",
        )
    else:
        report = replay(directory, instance_id, tuple(state["checkpoint"]), store)
        if report.records:
            log.warning(
                "bookie %s replayed %d journal records (%d entries) into its store",
                bookie_id,
                report.records,
                report.entries,
            )
    store.flush()  # the replayed writes are durable: the journal files are no longer needed
    store.mark_journal_backed()
    start = max(files, default=0) + 1
    # The old files go first: the synced store holds all they held, and on a full disk their
    # preallocated space is what the new file needs. Replay from the old checkpoint then finds
    # nothing, so the order is safe at any crash; and the checkpoint moves before the new file
    # exists, so a crash never leaves journal files without a JOURNAL state (refused as foreign).
    delete_before(directory, start)
    journal = Journal(
        directory,
        instance_id,
        config.journal_file_bytes,
        start,
        fsync=config.fsync,
        group_seq=report.last_group_seq,
        open_first=False,
    )
    try:
        write_state(directory, instance_id, bookie_id, journal.position())
        journal.probe()  # makes the first file
    except OSError as exc:
        if not is_disk_full(exc, directory):
            raise
        # Read-only, not down: the bookie still serves its copies, and its probe finds the space.
        report.disk_full = f"{exc}"
        log.warning(
            "bookie %s: its journal disk %s is full (%s): it starts read-only", bookie_id, directory, exc
        )
    return journal, report
