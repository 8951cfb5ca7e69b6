"""The request/reply envelope shared by every fencepost server (bookies and brokers).

A message is one ZeroMQ frame holding a msgpack map. Requests carry the protocol
version ``v``, an operation name ``op`` and a request id ``rid`` chosen by the
client; every request gets exactly one reply with the same ``rid`` and ``ok``
true or false. A failed reply names an error ``code`` (a stable, machine-readable
word such as ``fenced`` or ``not_leader``) and a human ``message``.

Versions: a request's ``v`` is the protocol version its client speaks. A server
serves every version in :data:`SERVED_VERSIONS` (this software's and the one
before it, never below :data:`BASE_PROTOCOL_VERSION`) and answers any other with
``wrong_version``, naming the request's version and the range. A reply's ``v`` is
its server's newest version, and a client reads a reply of any version from the
base on (it uses the fields it knows), so clients one version back keep working
against upgraded servers and the other way round (docs/upgrading.md).

Encoding and decoding are pure so they can be tested without sockets. Decoding
never trusts its input: bad bytes raise :class:`WireError`, which a server turns
into an error reply (see :func:`error_reply`) before carrying on.

Every error that carries a wire code derives from :class:`CodedError`; a
subclass that stands for one code declares it (``class X(..., code=E_FENCED)``)
and :func:`error_for` turns an error reply into the most specific one. The
codes themselves are in :mod:`election.wire.codes`.

Example::

    frame = encode(request("read", 7, ledger=3, entry=0))
    msg = decode(frame, max_bytes=1 << 20)
    assert msg["op"] == "read"
"""

from __future__ import annotations

import reprlib
from typing import Any, NamedTuple, TypeVar

import msgpack

from election.wire.codes import E_BAD_REQUEST, E_INTERNAL, E_MALFORMED, E_OVERSIZED, E_UNKNOWN_OP, E_VERSION

# The first protocol version; every later one is bumped by a change of an op's meaning or fields that an
# older peer would misread (a new op needs no bump: an older server answers it `unknown_op`).
BASE_PROTOCOL_VERSION = 1
# The version this software sends and the newest it serves.
PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 8 * 1024 * 1024

__all__ = [
    "CodedError",
    "WireError",
    "RemoteError",
    "error_for",
    "encode",
    "decode",
    "decode_request",
    "request",
    "ok_reply",
    "error_reply",
    "check_reply",
    "field",
    "shown",
    "PROTOCOL_VERSION",
    "BASE_PROTOCOL_VERSION",
    "SERVED_VERSIONS",
    "VersionRange",
    "DEFAULT_MAX_FRAME_BYTES",
    "E_MALFORMED",
    "E_OVERSIZED",
    "E_VERSION",
    "E_UNKNOWN_OP",
    "E_BAD_REQUEST",
    "E_INTERNAL",
]

# The one code -> exception table, filled by the subclasses that declare a code.
_BY_CODE: dict[str, list[type["CodedError"]]] = {}
E = TypeVar("E", bound="CodedError")


class CodedError(Exception):
    """An error with a stable wire ``code`` and a human ``message``.

    Package errors derive from it and from their package root, so both kinds of
    ``except`` catch them::

        class LedgerFencedError(BookieError, code=E_FENCED): ...
        raise error_for(BookieError, reply["error"], reply["message"])
    """

    def __init_subclass__(cls, code: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            _BY_CODE.setdefault(code, []).append(cls)

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def error_for(root: type[E], code: str, message: str) -> E:
    """The exception for an error reply: the subclass of ``root`` declared for ``code``, else ``root``."""
    for cls in _BY_CODE.get(code, ()):
        if issubclass(cls, root):
            return cls(code, message)
    return root(code, message)


class WireError(CodedError):
    """A frame that cannot be accepted; ``code`` is the wire error code."""

    def __init__(self, code: str, message: str, rid: Any = None) -> None:
        super().__init__(code, message)
        self.rid = rid


class RemoteError(CodedError):
    """An error reply received from a server."""


class VersionRange(NamedTuple):
    """The protocol versions a server serves, both ends included::

    VersionRange(1, 2).text()   # 'versions 1 to 2'
    2 in VersionRange(1, 2)     # True
    """

    low: int
    high: int

    def __contains__(self, version: object) -> bool:
        return type(version) is int and self.low <= version <= self.high

    def text(self) -> str:
        return f"version {self.low} only" if self.low == self.high else f"versions {self.low} to {self.high}"


# What this software serves: its own version and the one before it (the promise to clients one version back).
SERVED_VERSIONS = VersionRange(max(BASE_PROTOCOL_VERSION, PROTOCOL_VERSION - 1), PROTOCOL_VERSION)


def encode(msg: dict) -> bytes:
    """Encode one message map into a frame."""
    return msgpack.packb(msg, use_bin_type=True)


def request(op: str, rid: int, **fields: Any) -> dict:
    """Build a request map for operation ``op``."""
    msg = {"v": PROTOCOL_VERSION, "op": op, "rid": rid}
    msg.update(fields)
    return msg


def ok_reply(rid: Any, **fields: Any) -> dict:
    """Build a successful reply to request ``rid``."""
    msg = {"v": PROTOCOL_VERSION, "rid": rid, "ok": True}
    msg.update(fields)
    return msg


def error_reply(rid: Any, code: str, message: str, **fields: Any) -> dict:
    """Build a failed reply to request ``rid``."""
    msg = {"v": PROTOCOL_VERSION, "rid": rid, "ok": False, "error": code, "message": message}
    msg.update(fields)
    return msg


# Error messages quote request values through this: a builtin repr of a value nested a thousand
# levels deep (msgpack decodes a little deeper) raises RecursionError, and a long one is noise.
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 3, 60, 60, 40


def shown(value: Any) -> str:
    """A short, bounded ``repr`` of a request value, safe for any depth and size, for an error message."""
    return _SHOWN.repr(value)


def decode(
    frame: bytes, max_bytes: int = DEFAULT_MAX_FRAME_BYTES, versions: VersionRange | None = None
) -> dict:
    """Decode and validate one frame; raise :class:`WireError` on anything off.

    The checks run cheapest first so an oversized frame is refused before it is
    parsed. The request id is recovered when possible so the error reply can
    still be matched by the client. ``versions``: the protocol versions accepted
    (a server's :data:`SERVED_VERSIONS`); None, for a reply: any version from the base on.
    """
    if len(frame) > max_bytes:
        raise WireError(
            E_OVERSIZED, f"frame of {len(frame)} bytes exceeds the limit of {max_bytes}", peek_rid(frame)
        )
    try:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise WireError(E_MALFORMED, f"not a msgpack frame ({type(exc).__name__})") from None
    if not isinstance(msg, dict):
        raise WireError(E_MALFORMED, "frame is not a map")
    rid = msg.get("rid")
    version = msg.get("v")
    if versions is None:
        if type(version) is not int or version < BASE_PROTOCOL_VERSION:
            raise WireError(
                E_VERSION, f"a reply of protocol version {shown(version)}: not a fencepost reply", rid
            )
    elif version not in versions:
        raise WireError(
            E_VERSION,
            f"protocol version {shown(version)} is not served here: this server serves {versions.text()}",
            rid,
        )
    return msg


# Bytes of a frame's start read for its rid: the envelope fields come first (see `request`).
_PEEK_BYTES = 256


def peek_rid(frame: bytes) -> Any:
    """The ``rid`` among the first fields of a frame too large to decode, or None; reads only its start.

    So that the refusal of an oversized frame can still be matched by the client.
    """
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(frame[:_PEEK_BYTES])
    try:
        for _ in range(min(unpacker.read_map_header(), 4)):
            if unpacker.unpack() == "rid":
                rid = unpacker.unpack()
                return rid if isinstance(rid, (int, str)) and not isinstance(rid, bool) else None
            unpacker.skip()
    except Exception:  # msgpack raises several unrelated types on a frame cut short or garbled
        return None
    return None


def decode_request(
    frame: bytes,
    known_ops: frozenset[str] | set[str],
    max_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    versions: VersionRange = SERVED_VERSIONS,
) -> dict:
    """Decode a request frame of a version in ``versions`` and check that it names a known operation."""
    msg = decode(frame, max_bytes, versions)
    op = msg.get("op")
    if not isinstance(op, str):
        raise WireError(E_MALFORMED, "request has no operation", msg.get("rid"))
    if op not in known_ops:
        raise WireError(E_UNKNOWN_OP, f"unknown operation {shown(op)}", msg.get("rid"))
    msg.setdefault("rid", None)  # a request without an id is answered with a null one, as for a null id
    return msg


def check_reply(msg: dict) -> dict:
    """Return a reply map, raising :class:`RemoteError` when it reports a failure."""
    if not msg.get("ok"):
        raise RemoteError(str(msg.get("error", E_INTERNAL)), str(msg.get("message", "")))
    return msg


def field(msg: dict, name: str, kind: type | tuple[type, ...]) -> Any:
    """Return ``msg[name]`` if present and of type ``kind``, else raise a bad_request error."""
    value = msg.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise WireError(
            E_BAD_REQUEST,
            f"field {name!r} is missing or not {getattr(kind, '__name__', kind)}",
            msg.get("rid"),
        )
    return value
