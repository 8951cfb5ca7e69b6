"""The bytes of a bookie's journal: file header, sync groups and records (pure; no I/O).

A journal file is ``<seq:012d>.jnl`` (``seq`` counts up across the bookie's life):

* a header block of ``ALIGN`` bytes: magic, format version, the file's ``seq`` and the
  store's instance id (a file from another bookie is refused), with its CRC32C;
* then **groups**, each starting at a multiple of ``ALIGN``: a group is what one
  ``fdatasync`` covers (the adds of one group commit, or one fence or delete). Its
  header holds a magic, a group sequence number, the body's length, the number of
  records and a CRC32C of those fields; the body is the records, zero padding follows
  up to the next ``ALIGN`` boundary;
* unwritten space is zeros (the file is preallocated).

A record is ``length u32, crc32c u32`` and a body of ``length`` bytes covered by the
CRC: ``kind u8, ledger u64, first u64, lac i64, count u32`` and, for an add run,
``count`` entries as ``u32`` length + the encoded entry exactly as received.

Groups start on ``ALIGN`` boundaries so that, after a damaged group, replay can look
for a later valid group header without parsing what lies between
(:mod:`ledger.bookie.journal_replay`): that is how a torn tail (dropped) is told apart
from damage in the middle (an error).

Example::

    group = encode_group(7, [encode_add(3, 0, 0, [entry_0, entry_1]), encode_fence(4)])
    head = decode_group_header(group, 0)          # -> GroupHeader(seq=7, length=..., count=2)
    records = list(decode_records(group, GROUP_HEADER.size, head))
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator, Sequence

import crc32c

from ledger import LedgerError

ALIGN = 512
FILE_MAGIC = b"FPJRNL01"
FILE_VERSION = 1
GROUP_MAGIC = 0x46504A47  # "FPJG"
SUFFIX = ".jnl"

KIND_ADD, KIND_FENCE, KIND_DELETE = 1, 2, 3
KIND_NAMES = {KIND_ADD: "add run", KIND_FENCE: "fence", KIND_DELETE: "delete"}

FILE_HEADER = struct.Struct(">8sHQ32sI")  # magic, version, seq, instance id, crc32c of the rest
GROUP_HEADER = struct.Struct(">IQIII")  # magic, group seq, body length, records, crc32c of the rest
GROUP_MAGIC_BYTES = struct.pack(">I", GROUP_MAGIC)
RECORD_HEAD = struct.Struct(">II")  # body length, crc32c of the body
RECORD_BODY = struct.Struct(">BQQqI")  # kind, ledger, first entry, lac, entry count
_LEN = struct.Struct(">I")


class JournalFormatError(LedgerError):
    """A journal's bytes do not parse; ``offset`` is where, within the buffer given."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"{reason} at offset {offset}")
        self.offset = offset
        self.reason = reason


@dataclass(frozen=True)
class GroupHeader:
    seq: int
    length: int
    count: int

    @property
    def size(self) -> int:
        """Bytes the group takes in the file, padding included."""
        return padded(GROUP_HEADER.size + self.length)


@dataclass(frozen=True)
class Record:
    """One decoded record: ``entries`` is empty for a fence or a delete."""

    kind: int
    ledger: int
    first: int
    lac: int
    entries: list[bytes]


def file_name(seq: int) -> str:
    return f"{seq:012d}{SUFFIX}"


def file_seq(name: str) -> int | None:
    """The ``seq`` a journal file name carries, or None for any other name."""
    stem = name[: -len(SUFFIX)]
    return int(stem) if name.endswith(SUFFIX) and len(stem) == 12 and stem.isdigit() else None


def padded(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


def encode_file_header(seq: int, instance_id: str) -> bytes:
    fields = FILE_HEADER.pack(FILE_MAGIC, FILE_VERSION, seq, instance_id.encode().ljust(32)[:32], 0)[:-4]
    return (fields + crc32c.crc32c(fields).to_bytes(4, "big")).ljust(ALIGN, b"\0")


def decode_file_header(block: bytes) -> tuple[int, str]:
    """``(seq, instance_id)`` of a file's header block; JournalFormatError if it is not one."""
    if len(block) < FILE_HEADER.size:
        raise JournalFormatError(0, "file header cut short")
    magic, version, seq, instance, crc = FILE_HEADER.unpack_from(block)
    if magic != FILE_MAGIC:
        raise JournalFormatError(0, "not a journal file header")
    if crc32c.crc32c(block[: FILE_HEADER.size - 4]) != crc:
        raise JournalFormatError(0, "file header fails its crc32c")
    if version != FILE_VERSION:
        raise JournalFormatError(0, f"journal file format {version}, this bookie reads {FILE_VERSION}")
    return seq, instance.decode().strip()


def _record(kind: int, ledger: int, first: int, lac: int, entries: Sequence[bytes]) -> bytes:
    parts = [RECORD_BODY.pack(kind, ledger, first, lac, len(entries))]
    pack = _LEN.pack
    for data in entries:
        parts.append(pack(len(data)))
        parts.append(data)
    body = b"".join(parts)
    return RECORD_HEAD.pack(len(body), crc32c.crc32c(body)) + body


def encode_add(ledger: int, first: int, lac: int, entries: Sequence[bytes]) -> bytes:
    """A run of entries ``first, first + 1, ...`` of ``ledger`` (``lac``: the largest among them)."""
    return _record(KIND_ADD, ledger, first, lac, entries)


def encode_fence(ledger: int) -> bytes:
    return _record(KIND_FENCE, ledger, 0, -1, ())


def encode_delete(ledger: int) -> bytes:
    return _record(KIND_DELETE, ledger, 0, -1, ())


def encode_group(seq: int, records: Sequence[bytes]) -> bytes:
    """The bytes of one group, padded to ``ALIGN``."""
    body = b"".join(records)
    fields = GROUP_HEADER.pack(GROUP_MAGIC, seq, len(body), len(records), 0)[:-4]
    head = fields + crc32c.crc32c(fields).to_bytes(4, "big")
    size = len(head) + len(body)
    return b"".join((head, body, bytes(padded(size) - size)))


def decode_group_header(buf: bytes, offset: int) -> GroupHeader | None:
    """The valid group header at ``offset``, or None (zeros, garbage, a bad CRC, cut short)."""
    end = offset + GROUP_HEADER.size
    if end > len(buf):
        return None
    magic, seq, length, count, crc = GROUP_HEADER.unpack_from(buf, offset)
    if magic != GROUP_MAGIC or crc32c.crc32c(buf[offset : end - 4]) != crc:
        return None
    return GroupHeader(seq, length, count)


def decode_records(buf: bytes, offset: int, head: GroupHeader) -> Iterator[Record]:
    """The records of a group whose body starts at ``offset``; JournalFormatError at the first bad one."""
    end = offset + head.length
    if end > len(buf):
        raise JournalFormatError(offset, f"group body of {head.length} bytes runs past the end of the file")
    seen = 0
    while offset < end:
        if offset + RECORD_HEAD.size > end:
            raise JournalFormatError(offset, "record header cut short")
        length, crc = RECORD_HEAD.unpack_from(buf, offset)
        start = offset + RECORD_HEAD.size
        if length < RECORD_BODY.size or start + length > end:
            raise JournalFormatError(offset, f"record length {length} does not fit its group")
        body = buf[start : start + length]
        if crc32c.crc32c(body) != crc:
            raise JournalFormatError(offset, "record fails its crc32c")
        kind, ledger, first, lac, count = RECORD_BODY.unpack_from(body)
        if kind not in KIND_NAMES:
            raise JournalFormatError(offset, f"unknown record kind {kind}")
        entries, at = [], RECORD_BODY.size
        for _ in range(count):
            (size,) = _LEN.unpack_from(body, at)
            entries.append(bytes(body[at + 4 : at + 4 + size]))
            at += 4 + size
        if at != length:
            raise JournalFormatError(offset, "record entries do not fill its length")
        seen += 1
        yield Record(kind, ledger, first, lac, entries)
        offset = start + length
    if seen != head.count:
        raise JournalFormatError(offset, f"group holds {seen} records, its header says {head.count}")
