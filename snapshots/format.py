"""The snapshot file format: its layout, limits, header checks and errors.

docs/architecture.md ("Snapshots, checkpoints, retention and joining") tells
how snapshots are used. One snapshot is one file. All integers are big-endian::

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

Writing is :mod:`snapshots.writer`, reading and verifying :mod:`snapshots.reader`;
both take the layout, the limits and the header checks from here.
"""

from __future__ import annotations

import os
import re
import struct
from typing import Any

import crc32c as _crc32c
import msgpack

from snapshots import SnapshotError

MAGIC = b"FPSNAP01"
FOOTER_MAGIC = b"FPSNAPEND"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
COMPRESSION = "zlib"

BLOCK_TARGET = 1 << 20  # uncompressed bytes per block before it is flushed
MAX_RECORD_BYTES = 64 << 20  # one packed record (a task payload is far smaller)
MAX_BLOCK_RAW = BLOCK_TARGET + MAX_RECORD_BYTES + 64
MAX_BLOCK_COMPRESSED = MAX_BLOCK_RAW + (MAX_BLOCK_RAW >> 8) + 1024  # zlib's worst case fits
MAX_HEADER_BYTES = 64 << 10

U32 = struct.Struct(">I")
BLOCK = struct.Struct(">II")  # a block's compressed length and crc32c; (0, 0) ends the blocks
FOOTER = struct.Struct(">9sQI")
FOOTER_SIZE = FOOTER.size  # 21
HEADER_START = len(MAGIC) + U32.size
_HEX128 = re.compile(r"\A[0-9a-f]{32}\Z")
REQUIRED_KEYS = ("cluster_id", "broker_id", "position", "epoch", "created_at", "digest")
U64_MAX = (1 << 64) - 1


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


def crc32c(data: bytes | memoryview, value: int = 0) -> int:
    return _crc32c.crc32c(data, value)


def check_header(h: Any, path: Any) -> dict:
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
        or not all(type(x) is int and 0 <= x <= U64_MAX for x in pos)
    ):
        raise bad("position")
    if type(h.get("epoch")) is not int or h["epoch"] < 0:
        raise bad("epoch")
    if type(h.get("created_at")) not in (int, float):
        raise bad("created_at")
    if not isinstance(h.get("digest"), str) or not _HEX128.match(h["digest"]):
        raise bad("digest")
    if type(h.get("record_count")) is not int or not 0 <= h["record_count"] <= U64_MAX:
        raise bad("record_count")
    if h.get("compression") != COMPRESSION:
        raise bad(f"compression {h.get('compression')!r:.40}")
    h = dict(h)
    h["position"] = [pos[0], pos[1]]
    return h


def pack_header(h: dict) -> bytes:
    return msgpack.packb(h, use_bin_type=True)


def parse_header_region(region: bytes, path: Any) -> dict:
    """The header map at the start of ``region``; the rest must be zero padding."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=MAX_HEADER_BYTES)
    unpacker.feed(region)
    try:
        h = unpacker.unpack()
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise SnapshotCorrupt(path, f"bad header: not msgpack ({type(exc).__name__})") from None
    if region[unpacker.tell() :].strip(b"\0"):
        raise SnapshotCorrupt(path, "bad header: non-zero padding")
    return check_header(h, path)
