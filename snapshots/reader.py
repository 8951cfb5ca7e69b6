"""Reading and verifying a snapshot file (the layout is :mod:`snapshots.format`).

Reading never trusts a size from the file: every length is bounded before
anything is allocated or decompressed. Each block's CRC is checked before it
is decompressed, so a damaged block is refused as soon as it is met; the end
marker, the record count and the footer checksum (which also covers the header
and the block framing) after the last record. :func:`read_header` reads only
the start and the footer; :func:`verify_snapshot` checks every byte.

Example::

    verify_snapshot("snap.fps", cluster_id="dev")     # raises SnapshotCorrupt
    for db, key, value in iter_records("snap.fps"):
        ...
"""

from __future__ import annotations

import itertools
import operator
import os
import zlib
from typing import Any, BinaryIO, Iterator

import msgpack

from snapshots import SnapshotError
from snapshots.format import (
    BLOCK,
    FOOTER,
    FOOTER_MAGIC,
    FOOTER_SIZE,
    HEADER_START,
    MAGIC,
    MAX_BLOCK_COMPRESSED,
    MAX_BLOCK_RAW,
    MAX_HEADER_BYTES,
    MAX_RECORD_BYTES,
    U32,
    SnapshotCorrupt,
    WrongCluster,
    crc32c,
    parse_header_region,
)


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
        if self.size < HEADER_START + BLOCK.size + FOOTER_SIZE:
            raise self.corrupt("truncated")
        here = self.fh.tell()
        self.fh.seek(self.size - FOOTER_SIZE)
        magic, count, checksum = FOOTER.unpack(self.fh.read(FOOTER_SIZE))
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
        (region_len,) = U32.unpack(self.read(U32.size))
        if region_len > MAX_HEADER_BYTES or region_len > self.size - self.offset - FOOTER_SIZE:
            raise self.corrupt(f"bad header: region length {region_len}")
        header = parse_header_region(self.read(region_len), self.path)
        if header["record_count"] != self.footer_count:
            raise self.corrupt(
                f"record count mismatch: header says {header['record_count']}, "
                f"footer says {self.footer_count}"
            )
        return header

    def records(self) -> Iterator[tuple[str, bytes, bytes]]:
        """Yield every record, checking each block's CRC before decompressing it,
        then the end marker, the record count and the footer checksum."""
        return itertools.chain.from_iterable(self.blocks())

    def blocks(self) -> Iterator[list[tuple[str, bytes, bytes]]]:
        """Yield each block's records as one list (checked as :meth:`records` checks them): a
        consumer of millions of records then pays for one generator step per block, not per record."""
        end = self.size - FOOTER_SIZE
        count = 0
        while True:
            at = self.offset
            if at + BLOCK.size > end:
                raise self.corrupt(f"bad block length at offset {at}")
            length, crc = BLOCK.unpack(self.read(BLOCK.size))
            if length == 0:
                if crc != 0:
                    raise self.corrupt(f"bad end marker at offset {at}")
                break
            if length > MAX_BLOCK_COMPRESSED or self.offset + length > end:
                raise self.corrupt(f"bad block length at offset {at}")
            comp = self.read(length)
            if crc32c(comp) != crc:
                raise self.corrupt(f"bad block crc at offset {at}")
            recs = _block_records(comp, at, self.corrupt)
            count += len(recs)
            yield recs
        if self.offset != end:
            raise self.corrupt(f"{end - self.offset} unexpected bytes before the footer")
        if self.crc != self.footer_crc:
            raise self.corrupt("bad checksum")
        if count != self.footer_count:
            raise self.corrupt(f"record count mismatch: footer says {self.footer_count}, file holds {count}")


_TUPLE, _THREE, _STR, _BYTES = {tuple}, {3}, {str}, {bytes}
_DB, _KEY, _VALUE = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(2)


def _block_records(comp: bytes, at: int, corrupt: Any) -> list[tuple[str, bytes, bytes]]:
    d = zlib.decompressobj()
    try:
        raw = d.decompress(comp, MAX_BLOCK_RAW)
    except zlib.error:
        raise corrupt(f"bad block data at offset {at}") from None
    # A bigger output (a zip bomb), a cut stream or trailing bytes: all refused.
    if d.unconsumed_tail or not d.eof or d.unused_data:
        raise corrupt(f"bad block data at offset {at}")
    # One streaming unpacker over the block: a record costs two calls into C (its length, then
    # its array), and the position after it must be where its length said it ends.
    n = len(raw)
    unpacker = msgpack.Unpacker(raw=False, use_list=False, max_buffer_size=max(n, 1))
    unpacker.feed(raw)
    read_bytes, unpack, tell, from_bytes = unpacker.read_bytes, unpacker.unpack, unpacker.tell, int.from_bytes
    out: list[tuple[str, bytes, bytes]] = []
    append = out.append
    pos = 0
    while pos < n:
        size = from_bytes(read_bytes(4), "big")  # fewer than 4 bytes left: end > n below
        end = pos + 4 + size
        if size > MAX_RECORD_BYTES or end > n:
            raise corrupt(f"bad record in block at offset {at}")
        try:
            append(unpack())
        except Exception:
            raise corrupt(f"bad record in block at offset {at}") from None
        pos = tell()
        if pos != end:  # the record must end where its length said
            raise corrupt(f"bad record in block at offset {at}")
    # Every record (str, bytes, bytes), each exactly of its type: checked over the block at once.
    if out and (
        set(map(type, out)) != _TUPLE
        or set(map(len, out)) != _THREE
        or set(map(type, map(_DB, out))) != _STR
        or set(map(type, map(_KEY, out))) != _BYTES
        or set(map(type, map(_VALUE, out))) != _BYTES
    ):
        raise corrupt(f"bad record in block at offset {at}")
    return out


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


def iter_record_blocks(path: str | os.PathLike) -> Iterator[list[tuple[str, bytes, bytes]]]:
    """:func:`iter_records`, a block's records at a time (a list each), verified the same way:
    what a bulk load reads, millions of records with one generator step per block."""
    with _open(path) as fh:
        scan = _Scan(fh, os.fspath(path))
        scan.start()
        yield from scan.blocks()


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
        for _ in scan.blocks():
            pass
    if cluster_id is not None and header["cluster_id"] != cluster_id:
        raise WrongCluster(
            os.fspath(path),
            f"wrong cluster: snapshot is of {header['cluster_id']}, this cluster is {cluster_id}",
        )
    return dict(header, size=scan.size, checksum=scan.footer_crc)
