"""Restoring a snapshot file into an empty state store (joining, rebuilding, ``snapshot restore``).

The snapshot file belongs to ``snapshots/``; the store it is loaded into is the broker's, so
the loading lives here, above both (``snapshots`` never imports ``broker``).

Example::

    catalog = SnapshotCatalog.in_data_dir(data_dir)
    newest = catalog.latest_valid()
    # on a new member, before opening its StateStore:
    header = restore_snapshot(newest["path"], data_dir / "state", cluster_id="dev")
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import lmdb

from broker.state.store import DEFAULT_MAP_SIZE, StateStore
from broker.state.store_errors import StoreError, StoreIncomplete
from snapshots import SnapshotError
from snapshots.catalog import RestoreRefused
from snapshots.format import SnapshotCorrupt, WrongCluster
from snapshots.reader import iter_record_blocks, read_header, verify_snapshot

LMDB_FILES = ("data.mdb", "lock.mdb")


def _remove_store(state_dir: Path, created_dir: bool) -> None:
    for name in LMDB_FILES:
        try:
            os.unlink(state_dir / name)
        except FileNotFoundError:
            pass
    if created_dir:
        try:
            state_dir.rmdir()
        except OSError:
            pass


def restore_snapshot(
    path: str | os.PathLike, state_dir: str | os.PathLike, cluster_id: str, map_size: int | None = None
) -> dict:
    """Install the snapshot at ``path`` as the state store in ``state_dir``; return its header.

    Checks the header first (another cluster, a file that is not framed as a
    snapshot: nothing is touched), then verifies the rest of the file while
    loading it, in one pass (every block's CRC before its records are used, the
    record count and the footer checksum after the last): damage found there
    fails the load, whose files are removed. Refuses a ``state_dir`` whose store
    holds any state. A store left incomplete by an interrupted earlier restore is
    removed and loaded again. Records of an older store format (a format-1
    snapshot) are converted once loaded and checked. On any failure during
    loading the LMDB files are removed, so no half-installed store remains.

    The store is written without an fsync per transaction and flushed once when
    the load is complete (its ``loading`` marker makes an interrupted load, torn
    or not, refused at the next open).
    """
    header = read_header(path)
    if header["cluster_id"] != cluster_id:
        verify_snapshot(path, cluster_id)  # damage is reported as damage, else WrongCluster
        raise WrongCluster(os.fspath(path), f"wrong cluster: snapshot is of {header['cluster_id']}")
    state_dir = Path(state_dir)
    created_dir = not state_dir.exists()
    kw = {"map_size": map_size or DEFAULT_MAP_SIZE, "sync": False}
    try:
        try:
            store = StateStore(state_dir, **kw)
        except StoreIncomplete:
            # The marker proves these files are our own interrupted load, never real state.
            _remove_store(state_dir, created_dir=False)
            store = StateStore(state_dir, **kw)
    except (StoreError, lmdb.Error) as exc:
        if created_dir:
            _remove_store(state_dir, created_dir)
        raise RestoreRefused(f"cannot open the state store in {state_dir}: {exc}") from None
    try:
        position = store.position()
        records = store.iter_records()
        try:
            first = next(records, None)
        finally:
            records.close()  # it holds a read transaction
        if position is not None or first is not None:
            raise RestoreRefused(
                f"{state_dir} already holds state (position {list(position) if position else None}); "
                "restoring would overwrite it: move that directory away first"
            )
    except BaseException:
        store.close()
        if created_dir:
            _remove_store(state_dir, created_dir)
        raise
    # From here on the files are ours: any failure removes them.
    try:
        with store:
            records = itertools.chain.from_iterable(iter_record_blocks(path))
            digest = store.load_records(records, cluster_id=header["cluster_id"])
            if digest != header["digest"]:
                raise SnapshotCorrupt(path, f"records hash to {digest}, header says {header['digest']}")
            if store.position() != tuple(header["position"]):
                raise SnapshotCorrupt(
                    path, f"restored position {store.position()} is not the header's {header['position']}"
                )
            store.upgrade()
    except BaseException as exc:
        _remove_store(state_dir, created_dir)
        if isinstance(exc, StoreError):
            raise SnapshotError(f"restoring {os.fspath(path)} failed: {exc}") from exc
        raise
    return header
