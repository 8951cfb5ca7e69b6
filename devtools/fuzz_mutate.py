"""Raw byte mutation of valid request frames, and multi-part ZeroMQ messages, for the wire fuzzer.

:func:`valid_frames` builds well-formed requests of every op of a target with
the wire encoder (what a real client sends). :func:`mutate` then damages one
the way a broken or hostile peer would: bit flips, bytes set to msgpack type
codes, truncation, junk appended, spans deleted or repeated, a splice of two
frames, and corrupted msgpack length fields (a string, array or map header
that claims more or fewer items than follow). :func:`structured_frame` keeps
the framing and changes the fields instead, so the request checks are reached.
:func:`mutation_messages` mixes both into ZeroMQ messages: mostly one part, sometimes with extra leading
parts (which a ROUTER takes for routing and must echo), or an empty body.
Every frame passes the target's safety filter (:meth:`Target.harmless`).

The same seed gives the same messages, so a failing run can be replayed.

Example::

    messages = mutation_messages(BOOKIE, random.Random(5), 1000)
    assert all(isinstance(part, bytes) for msg in messages for part in msg)
"""

from __future__ import annotations

import itertools
import random
import struct
from typing import Any

import msgpack

from devtools.fuzz import hostile_value
from devtools.fuzz_targets import Target
from election import wire

# Type codes worth writing over a byte: nil, never-used, bool, bin/ext/str/array/map headers, -1.
INTERESTING = (
    0x00,
    0x7F,
    0x80,
    0x8F,
    0x90,
    0x9F,
    0xA0,
    0xBF,
    0xC0,
    0xC1,
    0xC2,
    0xC3,
    0xC4,
    0xC6,
    0xC7,
    0xC9,
    0xCA,
    0xCB,
    0xCF,
    0xD3,
    0xD4,
    0xD8,
    0xD9,
    0xDB,
    0xDC,
    0xDD,
    0xDE,
    0xDF,
    0xFF,
)
# Width of a length field after each header byte (fixed types keep theirs in the low bits).
_LENGTH_WIDTH = {
    0xC4: 1,
    0xC5: 2,
    0xC6: 4,
    0xC7: 1,
    0xC8: 2,
    0xC9: 4,
    0xD9: 1,
    0xDA: 2,
    0xDB: 4,
    0xDC: 2,
    0xDD: 4,
    0xDE: 2,
    0xDF: 4,
}
_FIXED_SIZE = {
    0xC0: 0,
    0xC2: 0,
    0xC3: 0,
    0xCA: 4,
    0xCB: 8,
    0xCC: 1,
    0xCD: 2,
    0xCE: 4,
    0xCF: 8,
    0xD0: 1,
    0xD1: 2,
    0xD2: 4,
    0xD3: 8,
    0xD4: 2,
    0xD5: 3,
    0xD6: 5,
    0xD7: 9,
    0xD8: 17,
}
_STRUCT = {1: ">B", 2: ">H", 4: ">I"}


class Raw:
    """Bytes that go into a frame as they are: a str that is not UTF-8, nesting deeper than encoders go."""

    def __init__(self, packed: bytes) -> None:
        self.packed = packed


def str_header(n: int) -> bytes:
    """The msgpack header of a str of ``n`` bytes (up to 65,535)."""
    if n < 32:
        return bytes([0xA0 | n])
    if n < 256:
        return bytes([0xD9, n])
    return bytes([0xDA]) + n.to_bytes(2, "big")


def deep(depth: int, as_map: bool) -> Raw:
    """``depth`` nested one-item arrays or maps around a 1: deeper than Python's repr can recurse."""
    return Raw((b"\x81\xa1a" if as_map else b"\x91") * depth + b"\x01")


def pack(msg: Any) -> bytes:
    """msgpack of ``msg``, with each :class:`Raw` written as its bytes."""
    raws: dict[str, bytes] = {}
    counter = itertools.count()

    def default(obj: Any) -> Any:
        if isinstance(obj, Raw):
            marker = f"\x00raw{next(counter):08d}\x00"
            raws[marker] = obj.packed
            return marker
        raise TypeError(f"cannot pack {type(obj).__name__}")

    frame = msgpack.packb(msg, use_bin_type=True, default=default)
    for marker, data in raws.items():
        frame = frame.replace(msgpack.packb(marker), data, 1)
    return frame


def valid_frames(target: Target, rng: random.Random, count: int) -> list[bytes]:
    """``count`` well-formed request frames over every op of ``target``, in turn."""
    frames = []
    for i in range(count):
        op = target.ops[i % len(target.ops)]
        frames.append(wire.encode(wire.request(op, rng.randrange(1 << 31), **target.fields(op, rng))))
    return frames


def length_fields(frame: bytes) -> list[tuple[int, int]]:
    """``(offset, width)`` of every msgpack length field in ``frame``; width 0: in the type byte's low bits.

    Walks the encoding as far as it is well formed, so a frame already damaged
    still yields the fields before the damage.
    """
    found: list[tuple[int, int]] = []
    pos, items, end = 0, 1, len(frame)
    while items and pos < end:
        items -= 1
        code = frame[pos]
        if code <= 0x7F or code >= 0xE0:
            pos += 1
        elif code <= 0x8F or 0x90 <= code <= 0x9F:
            found.append((pos, 0))
            items += (code & 0x0F) * (2 if code <= 0x8F else 1)
            pos += 1
        elif code <= 0xBF:
            found.append((pos, 0))
            pos += 1 + (code & 0x1F)
        elif code in _LENGTH_WIDTH:
            width = _LENGTH_WIDTH[code]
            if pos + 1 + width > end:
                break
            found.append((pos + 1, width))
            (n,) = struct.unpack_from(_STRUCT[width], frame, pos + 1)
            pos += 1 + width
            if code in (0xDC, 0xDD):
                items += n
            elif code in (0xDE, 0xDF):
                items += 2 * n
            else:
                pos += n + (1 if code in (0xC7, 0xC8, 0xC9) else 0)
        elif code in _FIXED_SIZE:
            pos += 1 + _FIXED_SIZE[code]
        else:  # 0xC1, never used: the rest cannot be walked
            break
    return found


def _corrupt_length(rng: random.Random, frame: bytearray) -> None:
    fields = length_fields(bytes(frame))
    if not fields:
        frame[rng.randrange(len(frame))] = rng.choice(INTERESTING)
        return
    offset, width = rng.choice(fields)
    if width == 0:
        code = frame[offset]
        frame[offset] = (code & 0xF0) | rng.randrange(16) if code < 0xA0 else 0xA0 | rng.randrange(32)
        return
    current = int.from_bytes(frame[offset : offset + width], "big")
    top = (1 << (8 * width)) - 1
    value = rng.choice(
        [0, 1, top, top - 1, max(current - 1, 0), min(current + 1, top), rng.randrange(top + 1)]
    )
    frame[offset : offset + width] = value.to_bytes(width, "big")


def mutate(rng: random.Random, frame: bytes, other: bytes) -> bytes:
    """``frame`` damaged by one to three mutations (``other`` is spliced in by some)."""
    out = bytearray(frame)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        if not out:
            out = bytearray(other[: rng.randrange(len(other) + 1)])
            continue
        kind = rng.randrange(9)
        at = rng.randrange(len(out))
        if kind == 0:
            out[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            out[at] = rng.choice(INTERESTING)
        elif kind == 2:
            del out[rng.randrange(len(out)) :]
        elif kind == 3:
            out += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
        elif kind == 4:
            del out[at : at + rng.randrange(1, 8)]
        elif kind == 5:
            span = out[at : at + rng.randrange(1, 16)]
            out[at:at] = span * rng.randrange(1, 4)
        elif kind == 6:
            cut = rng.randrange(len(other) + 1)
            out = out[:at] + other[cut:]
        else:
            _corrupt_length(rng, out)
    return bytes(out)


def mutate_fields(rng: random.Random, target: Target, fields: dict) -> dict:
    """``fields`` with one to three of them changed to a hostile value, dropped, or joined by an unknown one."""
    for _ in range(rng.randrange(1, 4)):
        action = rng.random()
        if action < 0.15 and fields:
            fields.pop(rng.choice(sorted(fields)))
        elif action < 0.3 or not fields:
            fields[rng.choice(target.field_names + ("zz", ""))] = hostile_value(rng)
        else:
            fields[rng.choice(sorted(fields))] = hostile_value(rng)
    return fields


def structured_frame(rng: random.Random, target: Target) -> bytes:
    """A well-framed request of a random op whose fields are mutated (what reaches the request checks).

    One in fifty has a field, the envelope's included, nested about as deep as msgpack decodes (1,000
    levels: deeper than Python's repr recurses) or deeper.
    """
    op = rng.choice(target.ops)
    msg = wire.request(op, rng.randrange(1 << 31), **mutate_fields(rng, target, target.fields(op, rng)))
    if rng.random() < 0.02:
        msg[rng.choice(sorted(msg))] = deep(rng.choice([600, 1000, 1020, 3000]), rng.random() < 0.5)
    return pack(msg)


def _extra_parts(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    """Leading parts of a multi-part message: empty delimiters, junk, whole request frames."""
    return [
        rng.choice([b"", b"\x00", rng.randbytes(rng.randrange(1, 40)), rng.choice(frames)])
        for _ in range(rng.randrange(1, 4))
    ]


def mutation_messages(target: Target, rng: random.Random, count: int, corpus: int = 512) -> list[list[bytes]]:
    """``count`` ZeroMQ messages (lists of parts) for ``target``, each body a mutated or valid frame."""
    frames = valid_frames(target, rng, corpus)
    messages: list[list[bytes]] = []
    while len(messages) < count:
        roll = rng.random()
        if roll < 0.1:  # one in ten goes out unchanged: the server must still serve them
            body = rng.choice(frames)
        elif roll < 0.6:
            body = structured_frame(rng, target)
        else:
            body = mutate(rng, rng.choice(frames), rng.choice(frames))
        if not target.harmless(body):
            continue
        roll = rng.random()
        if roll < 0.08:
            messages.append([*_extra_parts(rng, frames), body])
        elif roll < 0.10:
            messages.append([b""])
        else:
            messages.append([body])
    return messages
