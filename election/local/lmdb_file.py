"""Checking an LMDB data file against its own meta pages before it is mapped.

LMDB maps ``data.mdb`` and trusts it: a file cut short (a full disk, a bad copy)
makes the first read past its end kill the process with SIGBUS, with no message.
The two meta pages at the start of the file say how many pages the newest
transaction uses, so comparing that with the file's size finds a truncated file
while it is still only bytes on disk. Both stores use this: a bookie's (which
refuses to start, naming the kind of damage) and a broker's state store (which
is then moved aside and rebuilt). Damage LMDB itself detects in a later page is
left to LMDB, which raises.

Layout read here (LMDB 0.9, 64-bit, little-endian, as on every platform the
project runs on): each meta page is a 16-byte page header, then ``mm_magic u32``,
``mm_version u32``, ``mm_address``, ``mm_mapsize``, two 48-byte database records
(the first one's ``md_pad`` holds the page size), ``mm_last_pg u64``,
``mm_txnid u64``.

Example::

    facts = read_meta_facts("bookie/data.mdb")     # raises LmdbFileDamaged(kind, message)
    problem = check_lmdb_file("state/data.mdb")    # None, or the one-line reason
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from election import ElectionError

# The kinds of damage (stable words: a bookie's refusal names them).
EMPTY, TRUNCATED, UNREADABLE = "empty", "truncated", "unreadable"

_PAGE_HEADER = 16
_META = struct.Struct("<II8x8x")  # magic, version, (address), (mapsize)
_PSIZE = struct.Struct("<I")  # md_pad of the free-list MDB_db holds the page size
_TAIL = struct.Struct("<QQ")  # last page number, txn id
_PSIZE_OFF, _TAIL_OFF = _PAGE_HEADER + 24, _PAGE_HEADER + 120
_MAGIC, _VERSION = 0xBEEFC0DE, 1
_MIN_PAGE, _MAX_PAGE = 512, 1 << 16


class LmdbFileDamaged(ElectionError):
    """The data file cannot be what LMDB wrote; ``kind`` is EMPTY, TRUNCATED or UNREADABLE."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class MetaFacts:
    """What LMDB's newer meta page says about the data file."""

    page_size: int
    last_page: int
    txn_id: int

    @property
    def needed_bytes(self) -> int:
        return (self.last_page + 1) * self.page_size


def _meta_at(head: bytes, offset: int) -> MetaFacts | None:
    page = head[offset : offset + _TAIL_OFF + _TAIL.size]
    if len(page) < _TAIL_OFF + _TAIL.size:
        return None
    magic, version = _META.unpack_from(page, _PAGE_HEADER)
    (page_size,) = _PSIZE.unpack_from(page, _PSIZE_OFF)
    if (
        magic != _MAGIC
        or version != _VERSION
        or not _MIN_PAGE <= page_size <= _MAX_PAGE
        or page_size & (page_size - 1)
    ):
        return None
    return MetaFacts(page_size, *_TAIL.unpack_from(page, _TAIL_OFF))


def parse_meta_pages(head: bytes) -> MetaFacts:
    """What LMDB would use from the first two pages in ``head``: the valid meta page with the newest txn.

    Like LMDB, the first page must be valid (it gives the page size that
    locates the second). Raises ValueError when it is not.
    """
    first = _meta_at(head, 0)
    if first is None:
        raise ValueError("no valid LMDB meta page at the start of the file")
    second = _meta_at(head, first.page_size)
    return second if second is not None and second.txn_id > first.txn_id else first


def read_meta_facts(path: str | os.PathLike) -> MetaFacts:
    """Check ``path`` (a data.mdb) with plain reads; its meta facts, or LmdbFileDamaged naming the kind."""
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(2 * _MAX_PAGE)
    except OSError as exc:
        raise LmdbFileDamaged(UNREADABLE, f"cannot read {path}: {exc.strerror}") from None
    if size == 0:
        raise LmdbFileDamaged(EMPTY, f"{path} is empty (0 bytes)")
    try:
        facts = parse_meta_pages(head)
    except ValueError as exc:
        raise LmdbFileDamaged(UNREADABLE if size >= 2 * _MIN_PAGE else TRUNCATED, f"{path}: {exc}") from None
    if size < max(2 * facts.page_size, facts.needed_bytes):
        raise LmdbFileDamaged(
            TRUNCATED,
            f"{path} is truncated: {size} bytes, LMDB's meta page says "
            f"{facts.needed_bytes} ({facts.last_page + 1} pages of {facts.page_size})",
        )
    return facts


def check_lmdb_file(path: str | os.PathLike) -> str | None:
    """None if ``path`` is absent (a new store) or long enough for what its meta pages claim; else the reason."""
    if not os.path.exists(path):
        return None
    try:
        read_meta_facts(path)
    except LmdbFileDamaged as exc:
        return str(exc)
    return None
