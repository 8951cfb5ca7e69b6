"""The snapshots a broker keeps on disk: list, create, prune.

Snapshots live in ``<broker data>/snapshots/`` named
``snap-<ledger:010d>-<entry:010d>.fps`` after the position they hold, so
the name alone orders them; any other file there (``.tmp`` from a crashed
writer, ``.part`` from a download) is ignored.

The position is the whole identity of a snapshot's content (the state after
applying every entry up to it), so creating a snapshot at a position that
already has a valid file returns that file instead of writing another.

Full verification reads the whole file, so its outcome is remembered per
file (name, size, mtime, inode): the broker's request loop can answer
``snapshot_info`` repeatedly without re-reading gigabytes.

Example::

    catalog = SnapshotCatalog.in_data_dir(data_dir)
    info = catalog.create(store, cluster_id="dev", broker_id=3, clock=SYSTEM_CLOCK.now)
    catalog.prune(keep=3)
    newest = catalog.latest_valid()         # header + path, or None

Restoring a snapshot into a state store is :func:`broker.state.restore.restore_snapshot`
(the store is the broker's; this package stays below it).
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from snapshots import SnapshotError
from snapshots.format import SnapshotCorrupt
from snapshots.reader import read_header, verify_snapshot
from snapshots.writer import write_snapshot

NAME_RE = re.compile(r"\Asnap-(\d{10,20})-(\d{10,20})\.fps\Z")
SUBDIR = "snapshots"


class EmptyStore(SnapshotError):
    """The store has applied nothing yet: there is no state to snapshot."""


class RestoreRefused(SnapshotError):
    """Restoring would overwrite existing state (or the target is otherwise unusable)."""


class StoreView(Protocol):
    def snapshot_view(self) -> Any: ...


def snapshot_name(position: tuple[int, int] | list[int]) -> str:
    """The file name of a snapshot at ``position``."""
    return f"snap-{position[0]:010d}-{position[1]:010d}.fps"


def parse_name(name: str) -> tuple[int, int] | None:
    """The position a snapshot file name stands for, or None if it is not one."""
    m = NAME_RE.match(name)
    return None if m is None else (int(m.group(1)), int(m.group(2)))


class SnapshotCatalog:
    """The snapshot directory of one broker.

    Thread-safe: the request loop may call :meth:`latest_valid` while a
    checkpoint thread runs :meth:`create` and :meth:`prune`.

    Example::

        catalog = SnapshotCatalog("/data/broker-a/snapshots")
        for snap in catalog.list():          # newest first
            print(snap["name"], snap.get("position"), snap.get("error"))
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.dir = Path(directory)
        self.directory = self.dir  # the same path under its long name
        self._lock = threading.Lock()  # guards _verified
        self._create_lock = threading.Lock()  # one writer at a time in this process
        self._verified: dict[str, tuple[tuple, dict | None, str | None]] = {}

    @classmethod
    def in_data_dir(cls, data_dir: str | os.PathLike) -> "SnapshotCatalog":
        return cls(Path(data_dir) / SUBDIR)

    # ------------------------------------------------------------ listing

    def _names(self) -> list[tuple[tuple[int, int], str]]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        found = [(parse_name(n), n) for n in names]
        return sorted(((p, n) for p, n in found if p is not None), reverse=True)

    def path_of(self, name: str) -> Path:
        """The path of snapshot ``name``; refuses anything that is not a snapshot name
        (so a name from the network can never reach outside the directory)."""
        if not isinstance(name, str) or parse_name(name) is None:
            raise SnapshotError(f"not a snapshot name: {name!r:.80}")
        return self.dir / name

    def list(self) -> list[dict]:
        """Every snapshot file, newest position first.

        Each entry is the header plus ``name``, ``path``, ``size`` and
        ``checksum``; a file that cannot be read has ``name``, ``path``,
        ``size`` (if known) and ``error`` (the reason) instead. Only the
        framing is checked here (cheap); see :meth:`verify`.
        """
        out = []
        for position, name in self._names():
            path = self.dir / name
            try:
                header = read_header(path)
                if tuple(header["position"]) != position:
                    raise SnapshotCorrupt(
                        path, f"name says position {list(position)}, header says {header['position']}"
                    )
                out.append(dict(header, name=name, path=str(path)))
            except SnapshotError as exc:
                entry = {"name": name, "path": str(path), "error": getattr(exc, "reason", str(exc))}
                try:
                    entry["size"] = path.stat().st_size
                except OSError:
                    pass
                out.append(entry)
        return out

    def verify(self, name: str, cluster_id: str | None = None) -> dict:
        """Fully verify snapshot ``name`` (remembered per file version); return its entry.

        Raises :class:`SnapshotCorrupt` if it is damaged or of another cluster.
        """
        path = self.path_of(name)
        try:
            st = path.stat()
        except OSError as exc:
            raise SnapshotError(f"cannot read snapshot {path}: {exc.strerror}") from None
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        with self._lock:
            cached = self._verified.get(name)
        if cached is None or cached[0] != stamp:
            try:
                header, error = verify_snapshot(path), None
                if tuple(header["position"]) != parse_name(name):
                    header, error = None, "name and header positions differ"
            except SnapshotCorrupt as exc:
                header, error = None, exc.reason
            cached = (stamp, header, error)
            with self._lock:
                self._verified[name] = cached
        _, header, error = cached
        if header is None:
            raise SnapshotCorrupt(path, error or "corrupt")
        if cluster_id is not None and header["cluster_id"] != cluster_id:
            verify_snapshot(path, cluster_id)  # raises WrongCluster with the usual reason
        return dict(header, name=name, path=str(path))

    def _valid(self, cluster_id: str | None = None) -> Iterator[dict]:
        """Fully verified snapshots, newest first (lazily: stops when the caller does)."""
        for _, name in self._names():
            try:
                yield self.verify(name, cluster_id)
            except SnapshotError:
                continue

    def latest_valid(self, cluster_id: str | None = None) -> dict | None:
        """The newest snapshot that passes full verification, or None."""
        return next(self._valid(cluster_id), None)

    # ------------------------------------------------------------ writing

    def create(
        self, store: StoreView, cluster_id: str, broker_id: int | str, clock: Callable[[], float]
    ) -> dict:
        """Snapshot ``store`` now; return the header plus ``name``, ``path``, ``size``.

        Reads through ``store.snapshot_view()`` (one LMDB read transaction), so
        the store keeps applying batches meanwhile. If a valid snapshot of the
        same position exists it is returned with ``existing: True``. Raises
        :class:`EmptyStore` if the store has applied nothing. ``clock`` gives the wall-clock
        seconds stamped as ``created_at`` (a :class:`~election.local.clock.Clock`'s ``now``).
        """
        with self._create_lock:
            self.dir.mkdir(parents=True, exist_ok=True)
            with store.snapshot_view() as view:
                if view["position"] is None:
                    raise EmptyStore("the state store has applied nothing yet; there is nothing to snapshot")
                name = snapshot_name(view["position"])
                if (self.dir / name).exists():
                    try:
                        return dict(self.verify(name), existing=True)
                    except SnapshotCorrupt:
                        os.unlink(self.dir / name)  # damaged copy of what we are about to write
                header = {
                    "cluster_id": cluster_id,
                    "broker_id": broker_id,
                    "position": list(view["position"]),
                    "epoch": view["epoch"],
                    "created_at": float(clock()),
                    "digest": view["digest"],
                }
                final = write_snapshot(self.dir / name, header, view["records"])
        path = self.dir / name
        st = path.stat()
        with self._lock:  # we just wrote and checksummed it: no need to read it back again
            self._verified[name] = ((st.st_size, st.st_mtime_ns, st.st_ino), final, None)
        return dict(final, name=name, path=str(path), existing=False)

    def prune(self, keep: int) -> list[str]:
        """Keep the newest ``keep`` valid snapshots; delete every snapshot older than
        the oldest one kept. Returns the deleted paths.

        The newest valid snapshot is always kept (``keep`` < 1 counts as 1),
        and nothing is deleted unless a valid snapshot exists. Damaged files
        newer than the kept ones are left for an operator to look at.
        """
        keep = max(1, int(keep))
        kept: list[tuple[int, int]] = []
        for snap in self._valid():
            kept.append(tuple(snap["position"]))
            if len(kept) == keep:
                break
        if not kept:
            return []
        oldest_kept = kept[-1]
        deleted = []
        for position, name in self._names():
            if position < oldest_kept:
                try:
                    os.unlink(self.dir / name)
                except FileNotFoundError:
                    continue
                deleted.append(str(self.dir / name))
                with self._lock:
                    self._verified.pop(name, None)
        return deleted
