"""The snapshot file format: write, read, verify (docs/architecture.md, "Snapshots, checkpoints, retention and joining").

One snapshot is one file. All integers are big-endian::

    magic          b"FPSNAP01"                                   8 bytes
    header         u32 region length R, then R bytes: one msgpack map
                   followed by zero bytes (padding, see below)
    blocks         repeated: u32 compressed length C (> 0), u32 crc32c of
                   the C bytes, C bytes of one complete zlib stream
    end of blocks  u32 0, u32 0
    footer         b"FPSNAPEND", u64 record count, u32 checksum  21 bytes

The header map holds ``format_version`` (2), ``cluster_id``, ``broker_id``,
``position`` ([ledger, entry]), ``epoch``, ``created_at`` (float seconds,
passed in by the caller), ``digest`` (the store digest, 32 hex digits),
``record_count`` and ``compression`` ("zlib"). Unknown keys are kept, so a
later minor addition does not need a new version. The version also names the
layout of the records: 2 carries state store format 2 (compact task records,
binary ids); 1 has the same framing with format-1 records, which are still read
(restoring converts them), while a broker that reads only 1 refuses a 2.

A decompressed block is a run of records, each ``u32 length`` + a msgpack
array ``[db_name: str, key: bytes, value: bytes]``; no record spans two
blocks. The footer checksum is the CRC32C of every byte before the footer
(magic, header region, blocks, end marker). Block CRCs let a reader refuse a
damaged block as soon as it meets it (before it is decompressed); the footer
checksum also covers the header and the block framing.

Why the padding: ``record_count`` is only known once the records (streamed
from one LMDB read transaction) are written, but readers want it in the
header. The writer reserves a header region big enough for any count, writes
the blocks, then rewrites the header in place and computes the footer
checksum by reading the file back once (cheap next to compression: it is
compressed data, usually still in the page cache).

Writing goes to ``path + ".tmp"`` (created exclusively), is fsynced, renamed
over ``path`` and the directory fsynced, so a crash leaves either the old
state or the whole new file, plus at worst a ``.tmp`` that readers ignore and
:func:`cleanup_temp` removes. Reading never trusts a size from the file:
every length is bounded before anything is allocated or decompressed.

Example::

    info = write_snapshot("snap.fps", {"cluster_id": "dev", "broker_id": 1,
                                       "position": [3, 41], "epoch": 2,
                                       "created_at": clock(), "digest": digest},
                          store_records)
    verify_snapshot("snap.fps", cluster_id="dev")     # raises SnapshotCorrupt
    for db, key, value in iter_records("snap.fps"):
        ...
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import zlib
from typing import Any, BinaryIO, Iterable, Iterator

import crc32c as _crc32c
import msgpack

from election.local.files import fsync_dir
from snapshots import SnapshotError

MAGIC = b"FPSNAP01"
FOOTER_MAGIC = b"FPSNAPEND"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
COMPRESSION = "zlib"
TEMP_SUFFIX = ".tmp"

BLOCK_TARGET = 1 << 20  # uncompressed bytes per block before it is flushed
MAX_RECORD_BYTES = 64 << 20  # one packed record (a task payload is far smaller)
MAX_BLOCK_RAW = BLOCK_TARGET + MAX_RECORD_BYTES + 64
MAX_BLOCK_COMPRESSED = MAX_BLOCK_RAW + (MAX_BLOCK_RAW >> 8) + 1024  # zlib's worst case fits
MAX_HEADER_BYTES = 64 << 10
DEFAULT_LEVEL = 1  # zlib level: 1 is ~3x faster than 6 for ~15% more bytes

_U32 = struct.Struct(">I")
_BLOCK = struct.Struct(">II")
_FOOTER = struct.Struct(">9sQI")
FOOTER_SIZE = _FOOTER.size  # 21
_HEADER_START = len(MAGIC) + _U32.size
_HEX128 = re.compile(r"\A[0-9a-f]{32}\Z")
_REQUIRED = ("cluster_id", "broker_id", "position", "epoch", "created_at", "digest")
_U64_MAX = (1 << 64) - 1


class SnapshotCorrupt(SnapshotError):
    """A file that is not a whole, intact fencepost snapshot; ``reason`` says why.

    Reasons are stable phrases: ``truncated``, ``bad checksum``,
    ``bad block crc at offset N``, ``not a fencepost snapshot``,
    ``bad header: ...``, ``record count mismatch: ...``, ... and, from the
    :class:`WrongCluster` subclass, ``wrong cluster: snapshot is of X, this
    cluster is Y``.
    """

    def __init__(self, path: str | os.PathLike | None, reason: str) -> None:
        super().__init__(f"{os.fspath(path)}: {reason}" if path is not None else reason)
        self.path = None if path is None else os.fspath(path)
        self.reason = reason


class WrongCluster(SnapshotCorrupt):
    """An intact snapshot of another cluster (installing it would mix two clusters)."""


class SnapshotBusy(SnapshotError):
    """The temp file of this snapshot exists: another writer is on it, or a crash left it."""


def crc32c(data: bytes | memoryview, value: int = 0) -> int:
    return _crc32c.crc32c(data, value)


# ---------------------------------------------------------------- header


def _check_header(h: Any, path: Any) -> dict:
    """Validate a decoded header map; raise SnapshotCorrupt naming the first problem."""

    def bad(why: str) -> SnapshotCorrupt:
        return SnapshotCorrupt(path, f"bad header: {why}")

    if not isinstance(h, dict):
        raise bad("not a map")
    version = h.get("format_version")
    if version not in READABLE_VERSIONS:
        raise SnapshotCorrupt(path, f"unsupported format version {version!r:.40}")
    if not isinstance(h.get("cluster_id"), str) or not h["cluster_id"]:
        raise bad("cluster_id")
    if type(h.get("broker_id")) not in (int, str):
        raise bad("broker_id")
    pos = h.get("position")
    if (
        not isinstance(pos, (list, tuple))
        or len(pos) != 2
        or not all(type(x) is int and 0 <= x <= _U64_MAX for x in pos)
    ):
        raise bad("position")
    if type(h.get("epoch")) is not int or h["epoch"] < 0:
        raise bad("epoch")
    if type(h.get("created_at")) not in (int, float):
        raise bad("created_at")
    if not isinstance(h.get("digest"), str) or not _HEX128.match(h["digest"]):
        raise bad("digest")
    if type(h.get("record_count")) is not int or not 0 <= h["record_count"] <= _U64_MAX:
        raise bad("record_count")
    if h.get("compression") != COMPRESSION:
        raise bad(f"compression {h.get('compression')!r:.40}")
    h = dict(h)
    h["position"] = [pos[0], pos[1]]
    return h


def _pack_header(h: dict) -> bytes:
    return msgpack.packb(h, use_bin_type=True)


def _parse_region(region: bytes, path: Any) -> dict:
    """The header map at the start of ``region``; the rest must be zero padding."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=MAX_HEADER_BYTES)
    unpacker.feed(region)
    try:
        h = unpacker.unpack()
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise SnapshotCorrupt(path, f"bad header: not msgpack ({type(exc).__name__})") from None
    if region[unpacker.tell() :].strip(b"\0"):
        raise SnapshotCorrupt(path, "bad header: non-zero padding")
    return _check_header(h, path)


# ---------------------------------------------------------------- writing


def _file_crc(fh: BinaryIO, end: int) -> int:
    fh.seek(0)
    crc, left = 0, end
    while left:
        buf = fh.read(min(left, 1 << 20))
        if not buf:
            raise SnapshotError("snapshot temp file shrank while being written")
        crc = crc32c(buf, crc)
        left -= len(buf)
    return crc


def write_snapshot(
    path: str | os.PathLike,
    header: dict,
    records: Iterable[tuple[str, bytes, bytes]],
    level: int = DEFAULT_LEVEL,
) -> dict:
    """Write a snapshot of ``records`` to ``path`` atomically; return the final header.

    ``header`` needs ``cluster_id, broker_id, position, epoch, created_at,
    digest`` (other keys are stored too); ``format_version``,
    ``compression`` and ``record_count`` are filled in. The returned map adds
    ``size`` (file bytes) and ``checksum`` (the footer CRC32C). Raises
    :class:`SnapshotBusy` if ``path + ".tmp"`` exists, :class:`SnapshotError`
    on a bad header, a bad or oversized record, or an I/O error; on any error
    the temp file is removed and ``path`` is untouched.
    """
    path = os.fspath(path)
    missing = [k for k in _REQUIRED if k not in header]
    if missing:
        raise SnapshotError(f"snapshot header lacks {', '.join(missing)}")
    final = dict(header, format_version=FORMAT_VERSION, compression=COMPRESSION, record_count=_U64_MAX)
    try:
        final = _check_header(final, path)
    except SnapshotCorrupt as exc:
        raise SnapshotError(f"cannot write snapshot: {exc.reason}") from None
    # The largest count packs to the most bytes, so any real header fits the region.
    region_len = len(_pack_header(final))
    if region_len > MAX_HEADER_BYTES:
        raise SnapshotError(f"snapshot header of {region_len} bytes is too large")

    tmp = path + TEMP_SUFFIX
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise SnapshotBusy(
            f"{tmp} exists: another snapshot of this position is being written, "
            "or a crash left it (cleanup_temp removes it)"
        ) from None
    except OSError as exc:
        raise SnapshotError(f"cannot create {tmp}: {exc}") from None
    try:
        with os.fdopen(fd, "w+b", buffering=1 << 20) as fh:
            fh.write(MAGIC + _U32.pack(region_len) + bytes(region_len))
            count = _write_blocks(fh, records, level)
            fh.write(_BLOCK.pack(0, 0))
            end = fh.tell()
            final["record_count"] = count
            packed = _pack_header(final)
            fh.seek(_HEADER_START)
            fh.write(packed + bytes(region_len - len(packed)))
            fh.flush()
            checksum = _file_crc(fh, end)
            fh.seek(end)
            fh.write(_FOOTER.pack(FOOTER_MAGIC, count, checksum))
            fh.flush()
            os.fsync(fh.fileno())
            size = fh.tell()
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path) or ".")
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise SnapshotError(f"cannot write snapshot {path}: {exc}") from exc
        raise
    return dict(final, size=size, checksum=checksum)


def _write_blocks(fh: BinaryIO, records: Iterable[tuple[str, bytes, bytes]], level: int) -> int:
    """Pack, frame and compress ``records`` into blocks; return how many there were."""
    packer = msgpack.Packer(use_bin_type=True)
    pack, u32 = packer.pack, _U32.pack
    raw = bytearray()
    count = 0

    def flush() -> None:
        comp = zlib.compress(raw, level)
        fh.write(_BLOCK.pack(len(comp), crc32c(comp)))
        fh.write(comp)
        raw.clear()

    for rec in records:
        try:
            db, key, value = rec
            # bytes() because LMDB may hand out memoryviews; msgpack needs bytes for bin.
            item = pack([db, bytes(key), bytes(value)]) if isinstance(db, str) else None
        except (TypeError, ValueError) as exc:
            raise SnapshotError(f"bad snapshot record #{count}: {exc}") from None
        if item is None:
            raise SnapshotError(f"bad snapshot record #{count}: db name must be a str")
        if len(item) > MAX_RECORD_BYTES:
            raise SnapshotError(
                f"snapshot record #{count} ({db}) is {len(item)} bytes, "
                f"over the {MAX_RECORD_BYTES}-byte limit"
            )
        raw += u32(len(item))
        raw += item
        count += 1
        if len(raw) >= BLOCK_TARGET:
            flush()
    if raw:
        flush()
    return count


def cleanup_temp(directory: str | os.PathLike) -> list[str]:
    """Remove the ``*.fps.tmp`` files a crash left in ``directory``; return their paths.

    Call it when nothing can be writing there (broker start-up), since a live
    writer's temp file looks the same.
    """
    removed = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        if name.endswith(".fps" + TEMP_SUFFIX):
            p = os.path.join(os.fspath(directory), name)
            with contextlib.suppress(OSError):
                os.unlink(p)
                removed.append(p)
    return removed


# ---------------------------------------------------------------- reading


class _Scan:
    """Sequential, bounded reader of one snapshot file (shared by every read path)."""

    def __init__(self, fh: BinaryIO, path: Any) -> None:
        self.fh, self.path = fh, path
        self.size = os.fstat(fh.fileno()).st_size
        self.crc = 0
        self.offset = 0

    def corrupt(self, reason: str) -> SnapshotCorrupt:
        return SnapshotCorrupt(self.path, reason)

    def read(self, n: int) -> bytes:
        data = self.fh.read(n)
        if len(data) != n:
            raise self.corrupt("truncated")
        self.crc = crc32c(data, self.crc)
        self.offset += n
        return data

    def footer(self) -> tuple[int, int]:
        """(record count, checksum) from the footer, read without moving the scan."""
        if self.size < _HEADER_START + _BLOCK.size + FOOTER_SIZE:
            raise self.corrupt("truncated")
        here = self.fh.tell()
        self.fh.seek(self.size - FOOTER_SIZE)
        magic, count, checksum = _FOOTER.unpack(self.fh.read(FOOTER_SIZE))
        self.fh.seek(here)
        if magic != FOOTER_MAGIC:
            raise self.corrupt("truncated")
        return count, checksum

    def start(self) -> dict:
        """Check the magic and footer framing, then read and return the header."""
        magic = self.fh.read(len(MAGIC))
        if magic != MAGIC:
            # A short file that is a prefix of the magic is a cut-off snapshot.
            raise self.corrupt("truncated" if MAGIC.startswith(magic) else "not a fencepost snapshot")
        self.crc, self.offset = crc32c(magic), len(magic)
        self.footer_count, self.footer_crc = self.footer()
        (region_len,) = _U32.unpack(self.read(_U32.size))
        if region_len > MAX_HEADER_BYTES or region_len > self.size - self.offset - FOOTER_SIZE:
            raise self.corrupt(f"bad header: region length {region_len}")
        header = _parse_region(self.read(region_len), self.path)
        if header["record_count"] != self.footer_count:
            raise self.corrupt(
                f"record count mismatch: header says {header['record_count']}, "
                f"footer says {self.footer_count}"
            )
        return header

    def records(self) -> Iterator[tuple[str, bytes, bytes]]:
        """Yield every record, checking each block's CRC before decompressing it,
        then the end marker, the record count and the footer checksum."""
        end = self.size - FOOTER_SIZE
        count = 0
        while True:
            at = self.offset
            if at + _BLOCK.size > end:
                raise self.corrupt(f"bad block length at offset {at}")
            length, crc = _BLOCK.unpack(self.read(_BLOCK.size))
            if length == 0:
                if crc != 0:
                    raise self.corrupt(f"bad end marker at offset {at}")
                break
            if length > MAX_BLOCK_COMPRESSED or self.offset + length > end:
                raise self.corrupt(f"bad block length at offset {at}")
            comp = self.read(length)
            if crc32c(comp) != crc:
                raise self.corrupt(f"bad block crc at offset {at}")
            for rec in _block_records(comp, at, self.corrupt):
                count += 1
                yield rec
        if self.offset != end:
            raise self.corrupt(f"{end - self.offset} unexpected bytes before the footer")
        if self.crc != self.footer_crc:
            raise self.corrupt("bad checksum")
        if count != self.footer_count:
            raise self.corrupt(f"record count mismatch: footer says {self.footer_count}, file holds {count}")


def _block_records(comp: bytes, at: int, corrupt: Any) -> Iterator[tuple[str, bytes, bytes]]:
    d = zlib.decompressobj()
    try:
        raw = d.decompress(comp, MAX_BLOCK_RAW)
    except zlib.error:
        raise corrupt(f"bad block data at offset {at}") from None
    # A bigger output (a zip bomb), a cut stream or trailing bytes: all refused.
    if d.unconsumed_tail or not d.eof or d.unused_data:
        raise corrupt(f"bad block data at offset {at}")
    view, pos, n = memoryview(raw), 0, len(raw)
    unpackb = msgpack.unpackb
    while pos < n:
        if pos + 4 > n:
            raise corrupt(f"bad record in block at offset {at}")
        (size,) = _U32.unpack_from(view, pos)
        pos += 4
        if size > MAX_RECORD_BYTES or pos + size > n:
            raise corrupt(f"bad record in block at offset {at}")
        try:
            rec = unpackb(view[pos : pos + size], raw=False)
        except Exception:
            rec = None
        if (
            type(rec) is not list
            or len(rec) != 3
            or type(rec[0]) is not str
            or type(rec[1]) is not bytes
            or type(rec[2]) is not bytes
        ):
            raise corrupt(f"bad record in block at offset {at}")
        pos += size
        yield rec[0], rec[1], rec[2]


def _open(path: str | os.PathLike) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise SnapshotError(f"cannot open snapshot {os.fspath(path)}: {exc.strerror}") from None


def read_header(path: str | os.PathLike) -> dict:
    """The header of the snapshot at ``path`` plus ``size`` and ``checksum``.

    Cheap (reads the start and the footer only), so it does not prove the
    records are intact: use :func:`verify_snapshot` for that. Raises
    :class:`SnapshotCorrupt` for a file that is not framed as a snapshot.
    """
    with _open(path) as fh:
        scan = _Scan(fh, os.fspath(path))
        header = scan.start()
        return dict(header, size=scan.size, checksum=scan.footer_crc)


def iter_records(path: str | os.PathLike) -> Iterator[tuple[str, bytes, bytes]]:
    """Yield ``(db, key, value)`` for every record, verifying as it reads.

    Each block's CRC is checked before it is used; the end marker, the record
    count and the footer checksum are checked after the last record, so a
    consumer that reaches the end without :class:`SnapshotCorrupt` has read
    an intact file. A consumer that must not act on a damaged file at all
    calls :func:`verify_snapshot` first.
    """
    with _open(path) as fh:
        scan = _Scan(fh, os.fspath(path))
        scan.start()
        yield from scan.records()


def verify_snapshot(path: str | os.PathLike, cluster_id: str | None = None) -> dict:
    """Check the whole file; return its header (plus ``size`` and ``checksum``).

    Checks the magic, the header, every block CRC and record, the record
    count and the footer checksum, then (so that damage is reported as
    damage) that the snapshot belongs to ``cluster_id`` if one is given.
    Raises :class:`SnapshotCorrupt` (:class:`WrongCluster` for the last check).
    """
    with _open(path) as fh:
        scan = _Scan(fh, os.fspath(path))
        header = scan.start()
        for _ in scan.records():
            pass
    if cluster_id is not None and header["cluster_id"] != cluster_id:
        raise WrongCluster(
            os.fspath(path),
            f"wrong cluster: snapshot is of {header['cluster_id']}, this cluster is {cluster_id}",
        )
    return dict(header, size=scan.size, checksum=scan.footer_crc)
