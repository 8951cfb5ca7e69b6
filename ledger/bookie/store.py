"""A bookie's durable store: ledger entries in LMDB.

Why LMDB: one memory-mapped B+tree gives ordered keys (a ledger's entries are
contiguous, so deleting a ledger is one range scan) and a single write
transaction per group of adds: the bookie collects every add that arrived in one
poll turn and stores them with :meth:`BookieStore.add_runs`. A bookie opens it
with ``sync=False``: what makes an add durable is its journal record
(:mod:`ledger.bookie.journal`), and the store is synced only at checkpoints
(:meth:`BookieStore.flush`) and for its own markers.

Named databases:

``entries``  key ``>QQ`` (ledger, entry) -> the encoded entry exactly as received
``ledgers``  key ``>Q`` ledger -> msgpack ``{fenced, lac, last_entry}``
``meta``     store-wide facts: ``format_version``, ``instance_id`` (the same id as the
             cookie's, so a replaced or re-created data file is recognised),
             ``clean_shutdown`` (present only between an orderly close and the next start)
             and ``journal`` (present once a journal has written to the store: after an
             unclean stop, acknowledged entries may then be only in the journal)
``limbo``    key ``>Q`` ledger -> msgpack ``{reason, dropped}``: ledgers this bookie
             cannot vouch for (see :mod:`ledger.bookie.integrity`)

The LAC of a ledger is the largest ``lac`` field among its stored entries (the
writer piggybacks its LAC on every add). A fence is persisted before it is
acknowledged and every later add to that ledger is refused, which is what makes
ledger recovery safe (docs/architecture.md, "Fencing and recovery").

The data directory's cookie (which cluster and bookie id it belongs to) is in
:mod:`ledger.bookie.cookie`.

Example::

    store = BookieStore("/var/lib/fencepost/bookie", map_size=1 << 30)
    store.add_runs([(3, 0, [entry_0, entry_1], 0, False)])  # checked runs -> ["stored"]
    store.fence(3)                               # -> {"fenced": True, "lac": -1, "last_entry": 0}
    store.close()
"""

from __future__ import annotations

import errno
import os
import struct
from typing import Sequence

import lmdb
import msgpack

from ledger import LedgerError

DEFAULT_MAP_SIZE = 8 * 1024 * 1024 * 1024  # sparse: costs address space, not disk
DEFAULT_MAX_DBS = 8
# 2: written without sync, made whole by the journal (a format-1 store, always synced, is converted
# on open: it only needs a journal from then on; a bookie that reads only 1 refuses a 2).
FORMAT_VERSION = 2
_CONVERTIBLE = (1,)

STORED = "stored"
FENCED = "fenced"

_INSTANCE_KEY = b"instance_id"
_CLEAN_KEY = b"clean_shutdown"
_JOURNAL_KEY = b"journal"
_PROBE_KEY = b"probe-"
_PROBE_VALUE = 4000  # bytes: one overflow page each (4 KiB pages)

_ENTRY_KEY = struct.Struct(">QQ")
_LEDGER_KEY = struct.Struct(">Q")
_U64_MAX = (1 << 64) - 1


def _check_id(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _U64_MAX:
        raise LedgerError(f"{name} must be an integer in [0, 2^64), got {value!r}")


def _empty_info() -> dict:
    return {"fenced": False, "lac": -1, "last_entry": -1}


# Below this many free bytes, an I/O error while committing is taken for a full disk.
NEARLY_FULL_BYTES = 16 * 1024 * 1024


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes an unprivileged writer may still use on the filesystem of ``path``, or None if unknown."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def is_disk_full(exc: BaseException, path: str | os.PathLike | None = None) -> bool:
    """True if ``exc`` means the store cannot grow: LMDB's map is full or the disk is.

    LMDB reports a write that ran out of space either as ENOSPC or, when the page
    write comes up short, as EIO ("Input/output error"); with ``path`` given, an
    EIO on a filesystem with almost no free space counts as a full disk too.
    """
    if isinstance(exc, lmdb.MapFullError):
        return True
    if isinstance(exc, OSError):
        if exc.errno == errno.ENOSPC:
            return True
    elif not isinstance(exc, lmdb.Error):
        return False
    elif os.strerror(errno.ENOSPC) in str(exc):
        return True
    io_error = (isinstance(exc, OSError) and exc.errno == errno.EIO) or os.strerror(errno.EIO) in str(exc)
    if not io_error or path is None:
        return False
    free = free_bytes(path)
    return free is not None and free < NEARLY_FULL_BYTES


class ReadOnlyGate:
    """Read-only mode of a bookie whose disk is full: one state change per episode, not one per write.

    After a failed commit the bookie refuses adds at once and retries a real
    commit only every ``probe_s`` seconds; the first success ends the episode.
    The caller passes the time, so this is pure.

    Example::

        gate = ReadOnlyGate()
        if gate.may_try(now):
            ...commit; on a full disk: gate.failed(now) -> True the first time (log it)
            ...on success: gate.succeeded() -> True if this ended read-only mode (log it)
    """

    def __init__(self, probe_s: float = 1.0) -> None:
        self.probe_s = probe_s
        self.readonly = False
        self.events = 0
        self._probe_at = 0.0

    def may_try(self, now: float) -> bool:
        return not self.readonly or now >= self._probe_at

    def failed(self, now: float) -> bool:
        """Record a full-disk failure; True if the bookie just became read-only."""
        self._probe_at = now + self.probe_s
        if self.readonly:
            return False
        self.readonly = True
        self.events += 1
        return True

    def succeeded(self) -> bool:
        """Record a successful commit; True if it ended read-only mode."""
        was, self.readonly = self.readonly, False
        return was


class BookieStore:
    """The LMDB environment of one bookie. Not thread-safe: one owner thread."""

    def __init__(
        self,
        path: str | os.PathLike,
        map_size: int = DEFAULT_MAP_SIZE,
        sync: bool = True,
        max_dbs: int = DEFAULT_MAX_DBS,
    ) -> None:
        self.path = os.fspath(path)
        os.makedirs(self.path, exist_ok=True)
        try:
            self._env = lmdb.open(
                self.path,
                subdir=True,
                sync=sync,
                metasync=sync,
                max_dbs=max_dbs,
                map_size=map_size,
                readahead=False,
            )
        except lmdb.Error as exc:
            raise LedgerError(f"cannot open the bookie store at {self.path}: {exc}") from None
        self._entries = self._env.open_db(b"entries")
        self._ledgers = self._env.open_db(b"ledgers")
        self._meta = self._env.open_db(b"meta")
        self._limbo = self._env.open_db(b"limbo")
        with self._env.begin(write=True) as txn:
            version = txn.get(b"format_version", db=self._meta)
            # True when this open created the store: a file that should have held a bookie's
            # data but holds no store at all is then told apart from an old one.
            self.created = version is None
            if version is None:
                txn.put(b"format_version", str(FORMAT_VERSION).encode(), db=self._meta)
                txn.put(_CLEAN_KEY, b"1", db=self._meta)  # nothing in it to verify
            elif int(version) in _CONVERTIBLE:
                txn.put(b"format_version", str(FORMAT_VERSION).encode(), db=self._meta)
            elif int(version) != FORMAT_VERSION:
                raise LedgerError(
                    f"bookie store {self.path} has format {int(version)}, this bookie reads {FORMAT_VERSION}"
                )

    # -- identity and shutdown marker -------------------------------------------------

    def instance_id(self) -> str | None:
        """The instance id stamped into the store, or None for a store made before instance ids."""
        with self._env.begin() as txn:
            raw = txn.get(_INSTANCE_KEY, db=self._meta)
        return None if raw is None else raw.decode()

    def set_instance_id(self, instance_id: str) -> None:
        with self._env.begin(write=True) as txn:
            txn.put(_INSTANCE_KEY, instance_id.encode(), db=self._meta)
        self.flush()

    def journal_backed(self) -> bool:
        """True once a journal has written to this store (see :meth:`mark_journal_backed`)."""
        with self._env.begin() as txn:
            return txn.get(_JOURNAL_KEY, db=self._meta) is not None

    def mark_journal_backed(self) -> None:
        """Record (durably) that acknowledged writes may from now on be in the journal only until a checkpoint."""
        if not self.journal_backed():
            with self._env.begin(write=True) as txn:
                txn.put(_JOURNAL_KEY, b"1", db=self._meta)
            self.flush()

    def flush(self) -> None:
        """Make every committed transaction durable (one sync of the file): a checkpoint's store half.

        Safe from another thread than the writer's: LMDB's sync persists the transactions
        completed before it started.
        """
        self._env.sync(True)

    def was_clean(self) -> bool:
        """True if the last process using the store closed it in order (see :meth:`mark_clean`)."""
        with self._env.begin() as txn:
            return txn.get(_CLEAN_KEY, db=self._meta) is not None

    def clear_clean(self) -> None:
        """Drop the clean-shutdown marker (durably) before serving: a crash from now on is unclean."""
        with self._env.begin(write=True) as txn:
            txn.delete(_CLEAN_KEY, db=self._meta)
        self.flush()

    def mark_clean(self) -> None:
        """Record an orderly close; call after the last write, just before :meth:`close`."""
        self._env.sync(True)  # with fsync off, the data must reach the disk before the marker does
        with self._env.begin(write=True) as txn:
            txn.put(_CLEAN_KEY, b"1", db=self._meta)
        self._env.sync(True)

    # -- limbo: ledgers this bookie cannot vouch for ----------------------------------

    def limbo(self) -> dict[int, dict]:
        """``{ledger: {reason, dropped}}`` for every ledger in limbo."""
        with self._env.begin() as txn:
            with txn.cursor(db=self._limbo) as cursor:
                return {_LEDGER_KEY.unpack(k)[0]: msgpack.unpackb(v) for k, v in cursor.iternext()}

    def quarantine(self, ledger: int, reason: str, dropped: Sequence[int] = ()) -> None:
        """Put ``ledger`` in limbo and drop the entries ``dropped``, in one transaction."""
        _check_id("ledger", ledger)
        with self._env.begin(write=True) as txn:
            raw = txn.get(_LEDGER_KEY.pack(ledger), db=self._limbo)
            record = msgpack.unpackb(raw) if raw is not None else {"reason": reason, "dropped": []}
            record["dropped"] = sorted(set(record["dropped"]) | set(dropped))
            for entry in dropped:
                txn.delete(_ENTRY_KEY.pack(ledger, entry), db=self._entries)
            txn.put(_LEDGER_KEY.pack(ledger), msgpack.packb(record), db=self._limbo)

    def scan(self):
        """Every stored entry as ``(ledger, entry, data)`` in key order (one read transaction)."""
        unpack = _ENTRY_KEY.unpack
        with self._env.begin(buffers=False) as txn:
            with txn.cursor(db=self._entries) as cursor:
                for key, value in cursor.iternext():
                    ledger, entry = unpack(key)
                    yield ledger, entry, value

    def records(self) -> dict[int, dict]:
        """Every ledger record, ``{ledger: {fenced, lac, last_entry}}``."""
        with self._env.begin() as txn:
            with txn.cursor(db=self._ledgers) as cursor:
                return {_LEDGER_KEY.unpack(k)[0]: msgpack.unpackb(v) for k, v in cursor.iternext()}

    # -- records -------------------------------------------------------------------

    def _get_info(self, txn: lmdb.Transaction, ledger: int) -> dict | None:
        raw = txn.get(_LEDGER_KEY.pack(ledger), db=self._ledgers)
        return None if raw is None else msgpack.unpackb(raw)

    def _put_info(self, txn: lmdb.Transaction, ledger: int, info: dict) -> None:
        txn.put(_LEDGER_KEY.pack(ledger), msgpack.packb(info), db=self._ledgers)

    # -- writes --------------------------------------------------------------------

    def add_runs(self, runs: Sequence[tuple]) -> list[str]:
        """Store runs of consecutive, already checked entries in one write transaction.

        Each run is ``(ledger_id, first_entry_id, entries, lac, recovery)``:
        ``entries`` holds the encoded entries ``first_entry_id``,
        ``first_entry_id + 1``, ... of ``ledger_id``, ``lac`` is the largest LAC
        among their headers. The caller has checked all of it (the bookie does,
        with :func:`ledger.codec.check_run` or :func:`~ledger.codec.peek_header`,
        when it decodes the request), so nothing is parsed again here. One
        result per run: ``"stored"`` (every entry of the run) or ``"fenced"``
        (none: the ledger is fenced and the run is not a recovery add; within
        one transaction a ledger is fenced for all of its runs or for none).
        Commits (and fsyncs, unless the store was opened with ``sync=False``) before returning.
        """
        results: list[str] = []
        touched: dict[int, dict] = {}
        pack = _ENTRY_KEY.pack
        with self._env.begin(write=True) as txn:
            with txn.cursor(db=self._entries) as cursor:
                putmulti = cursor.putmulti
                for ledger, first, entries, lac, recovery in runs:
                    info = touched.get(ledger)
                    if info is None:
                        info = self._get_info(txn, ledger) or _empty_info()
                        touched[ledger] = info
                    if info["fenced"] and not recovery:
                        results.append(FENCED)
                        continue
                    if len(entries) == 1:
                        cursor.put(pack(ledger, first), entries[0])
                    else:
                        putmulti([(pack(ledger, first + i), data) for i, data in enumerate(entries)])
                    if lac > info["lac"]:
                        info["lac"] = lac
                    last = first + len(entries) - 1
                    if last > info["last_entry"]:
                        info["last_entry"] = last
                    results.append(STORED)
            for ledger, info in touched.items():
                self._put_info(txn, ledger, info)
        return results

    def probe_write(self, pages: int = 64) -> None:
        """Commit ``pages`` pages of data, then delete them: raises as an add would while the disk or map is full.

        A read-only bookie gets no adds (new ledgers leave it out), so it tries this
        itself to find out that space came back. One value per page, so that pages a
        delete freed here and there count (one big value would need them contiguous).
        """
        keys = [_PROBE_KEY + struct.pack(">I", i) for i in range(pages)]
        # A small commit first: LMDB reuses the pages a transaction freed (a deleted ledger's)
        # only two transactions later, and a failed probe does not count as one.
        with self._env.begin(write=True) as txn:
            txn.put(_PROBE_KEY + b"tick", b"1", db=self._meta)
        with self._env.begin(write=True) as txn:
            for key in keys:
                txn.put(key, bytes(_PROBE_VALUE), db=self._meta)
        with self._env.begin(write=True) as txn:
            for key in [*keys, _PROBE_KEY + b"tick"]:
                txn.delete(key, db=self._meta)

    def fence(self, ledger: int) -> dict:
        """Persist the fence of ``ledger`` (creating its record if needed); return its info."""
        _check_id("ledger", ledger)
        with self._env.begin(write=True) as txn:
            info = self._get_info(txn, ledger) or _empty_info()
            if not info["fenced"]:
                info["fenced"] = True
                self._put_info(txn, ledger, info)
        return info

    def delete_ledger(self, ledger: int) -> int:
        """Delete every entry of ``ledger`` and its record; return the number of entries deleted."""
        _check_id("ledger", ledger)
        deleted = 0
        with self._env.begin(write=True) as txn:
            with txn.cursor(db=self._entries) as cursor:
                if cursor.set_range(_ENTRY_KEY.pack(ledger, 0)):
                    while cursor.key() and _ENTRY_KEY.unpack(cursor.key())[0] == ledger:
                        cursor.delete()  # moves to the next record
                        deleted += 1
            txn.delete(_LEDGER_KEY.pack(ledger), db=self._ledgers)
            txn.delete(_LEDGER_KEY.pack(ledger), db=self._limbo)
        return deleted

    # -- reads ---------------------------------------------------------------------

    def read(self, ledger: int, entry: int) -> bytes | None:
        """The stored bytes of one entry, or None."""
        _check_id("ledger", ledger)
        _check_id("entry", entry)
        with self._env.begin() as txn:
            return txn.get(_ENTRY_KEY.pack(ledger, entry), db=self._entries)

    def ledger_info(self, ledger: int) -> dict | None:
        """``{fenced, lac, last_entry}`` of a ledger, or None if this bookie never heard of it."""
        _check_id("ledger", ledger)
        with self._env.begin() as txn:
            return self._get_info(txn, ledger)

    def list_ledgers(self) -> list[int]:
        """Every ledger this bookie holds a record for, in id order."""
        with self._env.begin() as txn:
            with txn.cursor(db=self._ledgers) as cursor:
                return [_LEDGER_KEY.unpack(key)[0] for key in cursor.iternext(keys=True, values=False)]

    def counts(self) -> dict:
        """``{ledgers, entries}``: record counts, read from the B+tree headers (cheap)."""
        with self._env.begin() as txn:
            return {
                "ledgers": txn.stat(self._ledgers)["entries"],
                "entries": txn.stat(self._entries)["entries"],
            }

    def used_bytes(self) -> int:
        """Bytes of the map in use: every page up to the last one written (free pages among them included)."""
        return (self._env.info()["last_pgno"] + 1) * self._env.stat()["psize"]

    def close(self) -> None:
        self._env.close()
