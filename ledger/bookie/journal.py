"""A bookie's journal: adds, fences and deletes appended to preallocated files, one fdatasync per group.

BookKeeper's split: the bookie acknowledges an add once its journal record is on disk,
while the entry store (LMDB, opened without sync) is made durable only at checkpoints
(:mod:`ledger.bookie.checkpoint`) and rebuilt from the journal after a crash
(:mod:`ledger.bookie.journal_replay`). One group commit of the serving loop is one
:meth:`Journal.write_group`: one ``pwrite`` of its records and one ``fdatasync``,
however many adds of however many ledgers it holds. Files are preallocated
(``posix_fallocate``) so that a sync rarely has file-size metadata to write, and
written sequentially; a group that would not fit starts the next file (a roll).
The format is :mod:`ledger.bookie.journal_format`.

The journal directory (``--journal-dir``, by default ``<data>/journal``, so that it can
sit on another disk) holds a ``JOURNAL`` file, written atomically: the store's
instance id (a directory of another bookie or instance is refused, as the cookie
does for the data directory) and the **checkpoint**, the journal position from which
replay starts (everything before it is durable in the store; files wholly before it
are deleted).

The journal is owned by the serving loop's thread; the checkpoint thread only
rewrites ``JOURNAL`` and deletes old files (:func:`write_state`, :func:`delete_before`).

Example::

    journal = Journal("/var/lib/bookie/journal", instance_id, file_bytes=64 << 20, start_seq=3)
    journal.write_group([encode_add(7, 0, -1, [entry]), encode_fence(8)])   # durable on return
    journal.position()   # -> (3, 1536): where the next group goes
    journal.close()
"""

from __future__ import annotations

import errno
import json
import logging
import os

from election.local.files import fsync_dir, write_json_atomically
from ledger import LedgerError
from ledger.bookie import crash_points
from ledger.bookie.journal_format import ALIGN, encode_file_header, encode_group, file_name, file_seq

log = logging.getLogger(__name__)

STATE_FILE = "JOURNAL"

Position = tuple[int, int]  # (file seq, offset): where a group starts


class JournalError(LedgerError):
    """The journal directory cannot be used by this bookie (another instance's, unreadable...)."""


def journal_files(directory: str) -> dict[int, str]:
    """``{seq: path}`` of the journal files in ``directory``."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return {}
    found = {}
    for name in names:
        seq = file_seq(name)
        if seq is not None:
            found[seq] = os.path.join(directory, name)
    return found


def read_state(directory: str) -> dict | None:
    """The ``JOURNAL`` file of ``directory`` (``instance_id``, ``bookie_id``, ``checkpoint``), or None."""
    path = os.path.join(directory, STATE_FILE)
    try:
        with open(path, "rb") as fh:
            state = json.loads(fh.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise JournalError(f"cannot read the journal state {path}: {exc}") from None
    checkpoint = state.get("checkpoint") if isinstance(state, dict) else None
    if (
        not isinstance(state.get("instance_id"), str)
        or not isinstance(checkpoint, list)
        or len(checkpoint) != 2
        or not all(isinstance(v, int) for v in checkpoint)
    ):
        raise JournalError(f"the journal state {path} is not a map with instance_id and checkpoint")
    return state


def write_state(directory: str, instance_id: str, bookie_id: str, checkpoint: Position) -> None:
    """Record the checkpoint (whole or not at all): replay starts there from now on."""
    write_json_atomically(
        os.path.join(directory, STATE_FILE),
        {"instance_id": instance_id, "bookie_id": bookie_id, "checkpoint": list(checkpoint)},
        sort_keys=True,
    )


def delete_before(directory: str, seq: int) -> int:
    """Delete the journal files wholly before file ``seq`` (a checkpoint passed them); how many."""
    deleted = 0
    for old, path in sorted(journal_files(directory).items()):
        if old < seq:
            try:
                os.unlink(path)
                deleted += 1
            except FileNotFoundError:
                pass
    return deleted


class Journal:
    """The open journal file the serving loop appends groups to (see the module docstring).

    ``start_seq`` is the file to create first (one past every existing file: a restarted
    bookie never appends to a file a crash may have torn). ``fsync=False`` (tests only)
    skips the syncs. With ``open_first=False`` the first file is made by the first group
    or :meth:`probe` (a start on a full disk). ``syncs``, ``groups``, ``records`` and
    ``bytes`` count what it did.
    """

    def __init__(
        self,
        directory: str,
        instance_id: str,
        file_bytes: int,
        start_seq: int,
        fsync: bool = True,
        group_seq: int = 0,
        open_first: bool = True,
    ) -> None:
        self.directory = directory
        self.instance_id = instance_id
        self.file_bytes = file_bytes
        self.fsync = fsync
        self.syncs = self.groups = self.records = self.bytes = self.rolls = 0
        self._group_seq = group_seq
        self._seq = start_seq - 1
        self._fd: int | None = None
        self._offset = 0
        if open_first:
            self._open_next()

    @property
    def path(self) -> str:
        return self.directory

    def position(self) -> Position:
        """Where the next group goes: every group before it is written (and synced)."""
        return (self._seq + (self._fd is None), self._offset if self._fd is not None else ALIGN)

    def write_group(self, records: list[bytes]) -> Position:
        """Append ``records`` as one group and make them durable; the position after them.

        Raises OSError (ENOSPC on a full disk) with nothing of the group counted as
        written: the next group is written where this one would have been, or, if the
        file itself failed, in a new file.
        """
        data = encode_group(self._group_seq + 1, records)
        if self._fd is None or (self._offset > ALIGN and self._offset + len(data) > self.file_bytes):
            self._open_next()
        try:
            if crash_points.CRASH is not None:
                crash_points.CRASH.reached(crash_points.BEFORE_JOURNAL_WRITE)
            written = os.pwrite(self._fd, data, self._offset)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"journal write of {len(data)} bytes stored {written}")
            if crash_points.CRASH is not None:
                crash_points.CRASH.reached(crash_points.AFTER_JOURNAL_WRITE)
            if self.fsync:
                os.fdatasync(self._fd)
                self.syncs += 1
        except OSError:
            self._abandon()
            raise
        self._group_seq += 1
        self._offset += len(data)
        self.groups += 1
        self.records += len(records)
        self.bytes += len(data)
        return self.position()

    def probe(self) -> None:
        """Raise OSError as :meth:`write_group` would if the journal cannot take a group (a full disk)."""
        if self._fd is None:
            self._open_next()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open_next(self) -> None:
        """Create, preallocate and head the next file; its header is durable before any group goes in."""
        self.close()
        seq = self._seq + 1
        path = os.path.join(self.directory, file_name(seq))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, self.file_bytes)
            os.pwrite(fd, encode_file_header(seq, self.instance_id), 0)
            if self.fsync:
                os.fdatasync(fd)
                fsync_dir(self.directory)
                self.syncs += 2
        except OSError:
            os.close(fd)
            os.unlink(path)  # nothing of it was acknowledged; a half-made file would read as a torn one
            raise
        self._fd, self._seq, self._offset = fd, seq, ALIGN
        self.rolls += 1

    def _abandon(self) -> None:
        """A write or sync failed: cut the file where its valid groups end and go on in a new one."""
        try:
            os.ftruncate(self._fd, self._offset)  # the failed group's bytes must not read as a torn tail
            if self.fsync:
                os.fdatasync(self._fd)
        except OSError as exc:
            log.warning(
                "could not cut the journal file %s at %d: %s", file_name(self._seq), self._offset, exc
            )
        self.close()
