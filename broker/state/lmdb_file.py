"""Checking an LMDB data file against its own meta pages before it is mapped.

LMDB maps ``data.mdb`` and trusts it: a file cut short (a full disk, a bad copy)
makes the first read past its end kill the process with SIGBUS, with no message.
The two meta pages at the start of the file say how many pages the newest
transaction uses, so comparing that with the file's size finds a truncated file
while it is still only bytes on disk. Damage LMDB itself detects (bad magic,
bad version, page numbers out of range) is left to LMDB, which raises.

Layout read here (64-bit LMDB, little-endian, as on every platform the project
runs on): each meta page is a 16-byte page header, then ``mm_magic u32``,
``mm_version u32``, ``mm_address``, ``mm_mapsize``, two 48-byte database records
(the first one's ``md_pad`` holds the page size), ``mm_last_pg u64``,
``mm_txnid u64``.

Example::

    problem = check_lmdb_file(Path("state/data.mdb"))
    if problem:
        raise StoreDamaged(path, problem)
"""
from __future__ import annotations

import os
import struct

MAGIC = 0xBEEFC0DE
_PAGE_HEADER = 16
_MAGIC_AT = _PAGE_HEADER            # mm_magic, mm_version
_PSIZE_AT = _PAGE_HEADER + 24       # mm_dbs[FREE_DBI].md_pad: the page size
_LAST_AT = _PAGE_HEADER + 120       # mm_last_pg, mm_txnid
_MIN_PAGE, _MAX_PAGE = 512, 1 << 16


def _meta(head: bytes, offset: int) -> tuple[int, int, int] | None:
    """(page size, last page, txn id) of the meta page at ``offset``, or None if it is not one."""
    if len(head) < offset + _LAST_AT + 16:
        return None
    magic, _version = struct.unpack_from("<II", head, offset + _MAGIC_AT)
    (psize,) = struct.unpack_from("<I", head, offset + _PSIZE_AT)
    last_pg, txnid = struct.unpack_from("<QQ", head, offset + _LAST_AT)
    if magic != MAGIC or not _MIN_PAGE <= psize <= _MAX_PAGE or psize & (psize - 1):
        return None
    return psize, last_pg, txnid


def check_lmdb_file(path: str | os.PathLike) -> str | None:
    """None if ``path`` is absent or long enough for what its meta pages claim; else the reason."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(_MAX_PAGE + _LAST_AT + 16)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read {os.fspath(path)}: {exc.strerror}"
    if size == 0:
        return "data.mdb is empty"
    first = _meta(head, 0)
    if first is None:
        return "data.mdb has no valid first meta page"
    psize = first[0]
    if size < 2 * psize:
        return f"data.mdb is truncated ({size} bytes, less than its two meta pages)"
    metas = [m for m in (first, _meta(head, psize)) if m is not None]
    _, last_pg, _ = max(metas, key=lambda m: m[2])
    needed = (last_pg + 1) * psize
    if size < needed:
        return f"data.mdb is truncated ({size} bytes, its newest meta page needs {needed})"
    return None
