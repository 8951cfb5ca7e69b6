"""Downloading a snapshot from a broker: chunked, checksummed, resumable.

Two operations on the broker's request socket (the envelope of
:mod:`election.wire`):

- ``snapshot_info`` (no fields) -> ``snapshot``: :func:`describe` of the
  broker's newest valid snapshot (``name, size, checksum, position, epoch,
  cluster_id, digest, created_at, record_count``), or null;
- ``snapshot_chunk`` ``name, offset, length`` -> ``data, crc, size``:
  :func:`read_chunk`; ``length`` is capped at :data:`MAX_CHUNK`.

The server side is two pure-ish functions over a :class:`SnapshotCatalog`
that the broker calls from its request loop; they raise
:class:`TransferError` whose ``code`` is the wire error code. The client side,
:func:`download`, takes a ``request(op, fields) -> reply`` callable so it is
tested without sockets.

A download writes ``<name>.part`` next to a ``<name>.part.json`` sidecar
holding the expected name, size and checksum. An interrupted download
(connection cut, broker gone, process killed) leaves both, and the next call
resumes from the ``.part``'s size if the server still offers the same
snapshot; otherwise it starts over. Each chunk's CRC32C is checked before it
is appended, and the finished file is fully verified before it is renamed
into place, so a file named ``snap-*.fps`` is always whole.

Example::

    def request(op, fields):
        return client.call(op, **fields)      # raises on an error reply
    path = download(request, data_dir / "snapshots", cluster_id="dev",
                    progress=lambda done, total: print(done, "/", total))
    broker.state.restore.restore_snapshot(path, data_dir / "state", cluster_id="dev")
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Callable

from election.local.files import fsync_dir, write_json_atomically
from election.wire import CodedError
from election.wire.codes import E_BAD_CHUNK, E_BAD_REPLY, E_BAD_REQUEST, E_NO_SNAPSHOT, E_NO_SUCH_SNAPSHOT
from snapshots import SnapshotError
from snapshots.catalog import SnapshotCatalog, parse_name
from snapshots.format import SnapshotCorrupt, WrongCluster, crc32c
from snapshots.reader import verify_snapshot

OP_INFO = "snapshot_info"
OP_CHUNK = "snapshot_chunk"
MAX_CHUNK = 1 << 20
PART = ".part"
SIDECAR = ".part.json"


Request = Callable[[str, dict], dict]

_INFO_FIELDS = (
    "name",
    "size",
    "checksum",
    "position",
    "epoch",
    "cluster_id",
    "digest",
    "created_at",
    "record_count",
)


class TransferError(CodedError, SnapshotError):
    """A transfer request the server refuses, or a reply the client refuses.

    ``code`` is the wire error code the broker should reply with
    (``no_such_snapshot``, ``bad_request``) or, on the client, ``bad_reply``
    / ``bad_chunk`` / ``no_snapshot`` (the words are in :mod:`election.wire.codes`).
    """


class SnapshotRefused(TransferError):
    """The client does not want the snapshot offered (``download``'s ``refuse`` gave a reason)."""


# ---------------------------------------------------------------- server side


def describe(catalog: SnapshotCatalog) -> dict | None:
    """The reply field ``snapshot`` for ``snapshot_info``: the newest valid snapshot, or None.

    The first call after a snapshot appears reads it through once (full
    verification); the outcome is remembered, so later calls only stat files.
    """
    snap = catalog.latest_valid()
    if snap is None:
        return None
    return {k: snap[k] for k in _INFO_FIELDS}


def read_chunk(catalog: SnapshotCatalog, name: Any, offset: Any, length: Any) -> dict:
    """The reply fields for ``snapshot_chunk``: ``{"data", "crc", "size"}``.

    ``name`` must be a snapshot file name present in the catalog (a name is
    never used as a path, so no traversal); ``offset`` must lie within the
    file; ``length`` is capped at :data:`MAX_CHUNK`. ``data`` is empty only at
    the end of the file.
    """
    if not isinstance(name, str) or parse_name(name) is None:
        raise TransferError(E_BAD_REQUEST, f"not a snapshot name: {name!r:.80}")
    for field, value in (("offset", offset), ("length", length)):
        if type(value) is not int or value < 0:
            raise TransferError(E_BAD_REQUEST, f"{field} must be an integer >= 0")
    path = catalog.path_of(name)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise TransferError(
            E_NO_SUCH_SNAPSHOT, f"no snapshot {name} here (it may have been pruned; ask snapshot_info again)"
        ) from None
    except OSError as exc:
        raise TransferError(E_NO_SUCH_SNAPSHOT, f"cannot read snapshot {name}: {exc.strerror}") from None
    try:
        size = os.fstat(fd).st_size
        if offset > size:
            raise TransferError(E_BAD_REQUEST, f"offset {offset} is past the end ({size} bytes)")
        data = os.pread(fd, min(length, MAX_CHUNK, size - offset), offset)
    finally:
        os.close(fd)
    return {"data": data, "crc": crc32c(data), "size": size}


# ---------------------------------------------------------------- client side


def _check_info(info: Any) -> dict:
    if info is None:
        raise TransferError(E_NO_SNAPSHOT, "the broker has no valid snapshot to offer")
    if not isinstance(info, dict) or not all(k in info for k in _INFO_FIELDS):
        raise TransferError(E_BAD_REPLY, "snapshot_info reply lacks fields")
    if not isinstance(info["name"], str) or parse_name(info["name"]) is None:
        raise TransferError(E_BAD_REPLY, f"snapshot_info names no snapshot: {info['name']!r:.80}")
    if type(info["size"]) is not int or info["size"] < 0 or type(info["checksum"]) is not int:
        raise TransferError(E_BAD_REPLY, "snapshot_info size or checksum is not an integer")
    return info


def _sidecar_doc(info: dict) -> dict:
    return {"name": info["name"], "size": info["size"], "checksum": info["checksum"]}


def _remove_parts(dest: Path, except_name: str | None = None) -> None:
    """Drop leftovers of downloads of other snapshots (they can never be resumed)."""
    for entry in os.listdir(dest):
        for suffix in (SIDECAR, PART):
            if entry.endswith(suffix):
                stem = entry[: -len(suffix)]
                if parse_name(stem) is not None and stem != except_name:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(dest / entry)
                break


def _resume_offset(part: Path, sidecar: Path, info: dict) -> int:
    """Bytes already fetched of this very snapshot (0 if anything does not match)."""
    try:
        doc = json.loads(sidecar.read_text())
        size = part.stat().st_size
    except (OSError, ValueError):
        return 0
    if doc != _sidecar_doc(info) or size > info["size"]:
        return 0
    return size


def download(
    request: Request,
    dest_dir: str | os.PathLike,
    progress: Callable[[int, int], None] | None = None,
    chunk: int = MAX_CHUNK,
    cluster_id: str | None = None,
    refuse: Callable[[dict], str | None] | None = None,
) -> Path:
    """Fetch the broker's newest snapshot into ``dest_dir``; return its final path.

    ``request(op, fields)`` sends one request and returns the reply map,
    raising on an error reply or a broken connection. ``progress(done,
    total)`` is called after each chunk. With ``cluster_id``, a snapshot of
    another cluster is refused before any byte is fetched (:class:`WrongCluster`), and so is
    one for which ``refuse(info)`` gives a reason (:class:`SnapshotRefused`; a joiner refuses a
    snapshot the log no longer covers).
    Any exception leaves ``<name>.part`` for the next call to resume; only a
    finished file that fails verification is thrown away (it cannot be
    resumed into a good one).
    """
    chunk = max(1, min(int(chunk), MAX_CHUNK))
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    info = _check_info(request(OP_INFO, {}).get("snapshot"))
    name, size = info["name"], info["size"]
    if cluster_id is not None and info["cluster_id"] != cluster_id:
        raise WrongCluster(
            name, f"wrong cluster: snapshot is of {info['cluster_id']}, this cluster is {cluster_id}"
        )
    reason = refuse(info) if refuse is not None else None
    if reason:
        raise SnapshotRefused(E_NO_SNAPSHOT, f"{name}: {reason}")
    final = dest / name
    if final.exists():
        with contextlib.suppress(SnapshotError):
            if verify_snapshot(final, cluster_id)["checksum"] == info["checksum"]:
                return final
    part, sidecar = dest / (name + PART), dest / (name + SIDECAR)
    _remove_parts(dest, except_name=name)
    offset = _resume_offset(part, sidecar, info)
    if offset == 0:
        write_json_atomically(sidecar, _sidecar_doc(info))
    with open(part, "r+b" if offset else "wb") as fh:
        fh.truncate(offset)
        fh.seek(offset)
        while offset < size:
            want = min(chunk, size - offset)
            reply = request(OP_CHUNK, {"name": name, "offset": offset, "length": want})
            data, crc = reply.get("data"), reply.get("crc")
            if not isinstance(data, bytes) or not 0 < len(data) <= want:
                raise TransferError(
                    E_BAD_CHUNK,
                    f"chunk at offset {offset} of {name} has "
                    f"{len(data) if isinstance(data, bytes) else 'no'} bytes",
                )
            if reply.get("size", size) != size:
                raise TransferError(
                    E_BAD_CHUNK, f"{name} changed size on the server ({reply['size']} != {size})"
                )
            if type(crc) is not int or crc32c(data) != crc:
                raise TransferError(E_BAD_CHUNK, f"chunk at offset {offset} of {name} fails its crc")
            fh.write(data)
            offset += len(data)
            if progress is not None:
                progress(offset, size)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        header = verify_snapshot(part, cluster_id)
        if header["checksum"] != info["checksum"]:
            raise SnapshotCorrupt(
                part, f"checksum {header['checksum']} is not the offered {info['checksum']}"
            )
    except SnapshotError:
        for p in (part, sidecar):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        raise
    os.replace(part, final)
    fsync_dir(dest)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sidecar)
    return final
