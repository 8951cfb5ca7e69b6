"""The ledger entry codec: the bytes an entry has on the wire and on a bookie's disk.

Layout (docs/architecture.md, "Entries"), all integers big-endian::

    ledger_id u64 | entry_id u64 | lac i64 | epoch u64 | length u32 | payload | digest

The digest covers the header and the payload. It is either CRC32C (4 bytes,
catches torn writes and bit rot) or HMAC-SHA256 (32 bytes, keyed by the cluster
secret, also catches a forged or misdirected entry). A reader that finds a bad
digest treats the copy as missing and reads another bookie, so decoding raises
:class:`CorruptEntry` instead of returning anything doubtful.

Bookies do not know the secret: they only need the header to file the entry and
to learn the piggybacked LAC, so :func:`peek_header` checks the framing against
every known digest size without verifying the digest itself.

Everything here is pure (no I/O) so that it is unit-tested on its own.

Example::

    digest = Digest.for_config("crc32c", None)
    data = encode_entry(Entry(ledger_id=3, entry_id=0, lac=-1, epoch=1, payload=b"x"), digest)
    assert decode_entry(data, digest).payload == b"x"
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass
from typing import Callable

import crc32c as _crc32c

from ledger import LedgerError

HEADER = struct.Struct(">QQqQI")
HEADER_SIZE = HEADER.size  # 36 bytes
_pack_header = HEADER.pack
_unpack_header = HEADER.unpack_from
CRC32C_SIZE = 4
HMAC_SHA256_SIZE = 32
DIGEST_SIZES = (CRC32C_SIZE, HMAC_SHA256_SIZE)
DIGEST_NAMES = ("crc32c", "hmac-sha256")

_U64_MAX = (1 << 64) - 1
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1
_U32_MAX = (1 << 32) - 1


class CorruptEntry(LedgerError):
    """Bytes that are not a valid entry; ``reason`` says what is wrong."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"corrupt entry: {reason}")
        self.reason = reason


class Digest:
    """A digest algorithm bound to its key (if any).

    Build one with :meth:`crc32c`, :meth:`hmac_sha256` or :meth:`for_config`;
    ``size`` is the number of digest bytes appended to each entry.
    """

    def __init__(self, name: str, size: int, fn: Callable[[bytes], bytes]) -> None:
        self.name = name
        self.size = size
        self._fn = fn

    @classmethod
    def crc32c(cls) -> "Digest":
        return cls("crc32c", CRC32C_SIZE, lambda b: _crc32c.crc32c(b).to_bytes(4, "big"))

    @classmethod
    def hmac_sha256(cls, secret: bytes) -> "Digest":
        if not isinstance(secret, (bytes, bytearray)) or not secret:
            raise LedgerError("hmac-sha256 digest needs a non-empty secret (bytes)")
        key = bytes(secret)
        return cls("hmac-sha256", HMAC_SHA256_SIZE, lambda b: hmac.new(key, b, hashlib.sha256).digest())

    @classmethod
    def for_config(cls, name: str, secret: bytes | None) -> "Digest":
        """The digest named by the cluster config's ``digest`` option."""
        if name == "crc32c":
            return cls.crc32c()
        if name == "hmac-sha256":
            if not secret:
                raise LedgerError("the cluster uses the hmac-sha256 digest but no secret was given")
            return cls.hmac_sha256(secret)
        raise LedgerError(f"unknown digest {name!r}: expected one of {', '.join(DIGEST_NAMES)}")

    def compute(self, data: bytes) -> bytes:
        """The digest of ``data`` (``size`` bytes)."""
        return self._fn(data)

    def __repr__(self) -> str:
        return f"Digest({self.name})"


@dataclass(frozen=True)
class Entry:
    """One ledger entry. ``lac`` is the writer's last-add-confirmed when it sent it."""

    ledger_id: int
    entry_id: int
    lac: int
    epoch: int
    payload: bytes


def encode_entry(entry: Entry, digest: Digest) -> bytes:
    """Serialize ``entry`` with its digest; raise LedgerError on out-of-range fields."""
    for name, value, low, high in (
        ("ledger_id", entry.ledger_id, 0, _U64_MAX),
        ("entry_id", entry.entry_id, 0, _U64_MAX),
        ("lac", entry.lac, _I64_MIN, _I64_MAX),
        ("epoch", entry.epoch, 0, _U64_MAX),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise LedgerError(f"entry field {name}={value!r} is out of range")
    payload = bytes(entry.payload)
    if len(payload) > _U32_MAX:
        raise LedgerError(f"payload of {len(payload)} bytes is too large")
    body = HEADER.pack(entry.ledger_id, entry.entry_id, entry.lac, entry.epoch, len(payload)) + payload
    return body + digest.compute(body)


def encode_run(
    ledger_id: int, first: int, lac: int, epoch: int, payloads: list[bytes], digest: Digest
) -> list[bytes]:
    """:func:`encode_entry` of entries ``first, first+1, ...`` of ``payloads``, without the checks: the writer's flush.

    For callers whose ids are already known to be in range and whose payloads are
    ``bytes`` of at most 2^32-1 bytes (:class:`~ledger.client.writer.LedgerWriter`
    checks both once); an out-of-range field still fails (``struct.error``), never
    encodes wrongly. One pass with the packer and the digest function bound once:
    a flush encodes hundreds of entries, and the calls per entry were a third of
    the encoding's cost.
    """
    pack, fn = _pack_header, digest._fn
    bodies = [pack(ledger_id, first + i, lac, epoch, len(p)) + p for i, p in enumerate(payloads)]
    return [body + fn(body) for body in bodies]


def decode_entry(data: bytes, digest: Digest) -> Entry:
    """Parse and verify an entry; raise :class:`CorruptEntry` if anything is off."""
    data = bytes(data)
    if len(data) < HEADER_SIZE + digest.size:
        raise CorruptEntry(f"too short: {len(data)} bytes, need at least {HEADER_SIZE + digest.size}")
    ledger_id, entry_id, lac, epoch, length = HEADER.unpack_from(data)
    expected = HEADER_SIZE + length + digest.size
    if len(data) != expected:
        raise CorruptEntry(
            f"length mismatch: header says {length} payload bytes, so {expected} in all, got {len(data)}"
        )
    body, mac = data[: -digest.size], data[-digest.size :]
    if not hmac.compare_digest(digest.compute(body), mac):
        raise CorruptEntry(f"bad {digest.name} digest for ledger {ledger_id} entry {entry_id}")
    return Entry(ledger_id, entry_id, lac, epoch, body[HEADER_SIZE:])


def peek_header(data: bytes) -> tuple[int, int, int, int, int]:
    """Return ``(ledger_id, entry_id, lac, epoch, length)`` without checking the digest.

    Used by bookies, which do not hold the secret. The framing must still be
    consistent with one of the known digest sizes, so a truncated or padded
    entry is refused at the door rather than stored.
    """
    if len(data) < HEADER_SIZE + min(DIGEST_SIZES):
        raise CorruptEntry(f"too short: {len(data)} bytes")
    ledger_id, entry_id, lac, epoch, length = HEADER.unpack_from(data)
    if len(data) - HEADER_SIZE - length not in DIGEST_SIZES:
        raise CorruptEntry(
            f"length mismatch: header says {length} payload bytes but the frame has {len(data)} bytes"
        )
    return ledger_id, entry_id, lac, epoch, length


def check_run(entries: object, ledger_id: int, first_entry_id: int) -> int:
    """Check a run of consecutive entries of one ledger; return the largest ``lac`` among them.

    ``entries`` must be a list of ``bytes`` whose headers name ``ledger_id`` and
    ``first_entry_id``, ``first_entry_id + 1``, ... in order, each framed as by
    :func:`peek_header` (the digest is not checked). This is the bookie's check
    of an ``add_batch`` request: one pass, one header unpack per entry. Raises
    :class:`CorruptEntry` naming the first offending entry.
    """
    if type(entries) is not list:
        raise CorruptEntry(f"entries must be a list, got {type(entries).__name__}")
    minimum = HEADER_SIZE + min(DIGEST_SIZES)
    sizes = DIGEST_SIZES
    unpack = _unpack_header
    best = _I64_MIN
    expected = first_entry_id
    for data in entries:
        if type(data) is not bytes:
            raise CorruptEntry(f"entry {expected} is {type(data).__name__}, not bytes")
        if len(data) < minimum:
            raise CorruptEntry(f"entry {expected}: too short: {len(data)} bytes")
        h_ledger, h_entry, lac, _epoch, length = unpack(data)
        if h_ledger != ledger_id or h_entry != expected:
            raise CorruptEntry(
                f"header says ledger {h_ledger} entry {h_entry}, expected {ledger_id}/{expected}"
            )
        if len(data) - HEADER_SIZE - length not in sizes:
            raise CorruptEntry(
                f"entry {expected}: length mismatch: header says {length} payload bytes "
                f"but the frame has {len(data)} bytes"
            )
        if lac > best:
            best = lac
        expected += 1
    return best
