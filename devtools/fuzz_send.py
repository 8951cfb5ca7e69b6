"""Send fuzzed messages to one server, pipelined, and check that each got exactly one reply.

Every message but a share of the single-part ones goes out with a leading tag
part (``FZ`` and its index): a ROUTER takes the parts before the body for the
route and echoes them, so the reply names the message it answers even when the
body was garbage with no request id. Untagged messages (the plain one-part
form real clients send) are checked by count. The report gives replies by
error code (``ok`` for successes), messages without a reply, extra replies
(a message answered twice), replies whose ``rid`` differs from the request's,
and for each kind of failure the first few offending messages in hex, to replay.

``connect`` makes a connected DEALER socket (a CURVE client on a secure
cluster); a stall replaces it, so a late reply is never counted twice.

Example::

    report = send_messages(lambda: dealer("tcp://127.0.0.1:5601"), [[frame] for frame in frames])
    assert report.ok(), report.as_dict()
"""

from __future__ import annotations

import collections
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import msgpack
import zmq

NO_REPLY = "no_reply"
EXTRA_REPLY = "extra_reply"
RID_MISMATCH = "rid_mismatch"
UNDECODABLE_REPLY = "undecodable_reply"
INTERNAL = "internal"
WINDOW = 64
TAG = b"FZ"
SAMPLES = 5
# One message in this many goes out untagged, as a plain one-part request.
PLAIN_EVERY = 8


def dealer(address: str) -> zmq.Socket:
    """A plain DEALER connected to ``address`` (the default socket factory)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.connect(address)
    return sock


@dataclass
class FuzzReport:
    """What came back for a run of messages."""

    sent: int = 0
    replies: collections.Counter = field(default_factory=collections.Counter)
    no_reply: int = 0
    extra_replies: int = 0
    rid_mismatches: int = 0
    samples: dict[str, list[str]] = field(default_factory=dict)

    def sample(self, kind: str, message: list[bytes]) -> None:
        kept = self.samples.setdefault(kind, [])
        if len(kept) < SAMPLES:
            kept.append(" | ".join(part.hex() for part in message)[:2000])

    def ok(self) -> bool:
        """Every message answered once, correctly addressed, never by the safety net."""
        return not (
            self.no_reply
            or self.extra_replies
            or self.rid_mismatches
            or self.replies.get(INTERNAL)
            or self.replies.get(UNDECODABLE_REPLY)
        )

    def merge(self, other: "FuzzReport") -> None:
        self.sent += other.sent
        self.replies.update(other.replies)
        self.no_reply += other.no_reply
        self.extra_replies += other.extra_replies
        self.rid_mismatches += other.rid_mismatches
        for kind, kept in other.samples.items():
            self.samples.setdefault(kind, []).extend(kept[: SAMPLES - len(self.samples.get(kind, []))])

    def as_dict(self) -> dict:
        return {
            "sent": self.sent,
            "replies": dict(sorted(self.replies.items())),
            NO_REPLY: self.no_reply,
            "extra_replies": self.extra_replies,
            "rid_mismatches": self.rid_mismatches,
            "samples": self.samples,
        }


def _rid_matches(body: bytes, rid: Any) -> bool:
    """False if ``body`` is a decodable map with an int or str ``rid`` that the reply did not echo."""
    try:
        msg = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception:  # garbage: no rid the server could have read
        return True
    sent = msg.get("rid") if isinstance(msg, dict) else None
    if not isinstance(sent, (int, str)) or isinstance(sent, bool):
        return True
    return rid == sent and type(rid) is type(sent)


def _reply(raw: bytes) -> tuple[str, Any]:
    try:
        msg = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception:
        return UNDECODABLE_REPLY, None
    if not isinstance(msg, dict) or not isinstance(msg.get("ok"), bool):
        return UNDECODABLE_REPLY, None
    return ("ok" if msg["ok"] else str(msg.get("error"))), msg.get("rid")


def send_messages(
    connect: Callable[[], zmq.Socket],
    messages: Iterable[list[bytes]],
    timeout_s: float = 2.0,
    window: int = WINDOW,
) -> FuzzReport:
    """Send ``messages`` (lists of parts) with at most ``window`` unanswered; check every reply."""
    report = FuzzReport()
    pending: dict[int, list[bytes]] = {}  # tag -> message, until answered
    plain = 0  # untagged messages not yet answered
    sock = connect()

    def take(parts: list[bytes]) -> None:
        nonlocal plain
        if len(parts) >= 2 and len(parts[0]) == 10 and parts[0].startswith(TAG):
            (index,) = struct.unpack(">Q", parts[0][2:])
            message = pending.pop(index, None)
            if message is None:
                report.extra_replies += 1
                report.sample(EXTRA_REPLY, parts)
                return
        elif len(parts) == 1 and plain:
            plain -= 1  # replies may come out of order: untagged ones are checked by count
            message = None
        else:
            report.extra_replies += 1
            report.sample(EXTRA_REPLY, parts)
            return
        code, rid = _reply(parts[-1])
        report.replies[code] += 1
        if code in (INTERNAL, UNDECODABLE_REPLY):
            report.sample(code, message or parts)
        elif message is not None and (parts[1:-1] != message[:-1] or not _rid_matches(message[-1], rid)):
            report.rid_mismatches += 1
            report.sample(RID_MISMATCH, message)

    def receive(block_s: float) -> bool:
        got, timeout_ms = False, int(block_s * 1000)
        while (pending or plain) and sock.poll(timeout_ms, zmq.POLLIN):
            take(sock.recv_multipart())
            got, timeout_ms = True, 0
        return got

    def give_up() -> None:
        nonlocal sock, plain
        report.no_reply += len(pending) + plain
        for message in pending.values():
            report.sample(NO_REPLY, message)
        pending.clear()
        plain = 0
        sock.close(0)
        sock = connect()

    try:
        for index, message in enumerate(messages):
            while len(pending) + plain >= window:
                if not receive(timeout_s):
                    give_up()
            if len(message) == 1 and index % PLAIN_EVERY == 0:
                plain += 1
                sock.send(message[0])
            else:
                pending[index] = message
                sock.send_multipart([TAG + struct.pack(">Q", index), *message])
            report.sent += 1
            receive(0)
        deadline = time.monotonic() + timeout_s
        while pending or plain:
            if receive(max(deadline - time.monotonic(), 0)):
                deadline = time.monotonic() + timeout_s
            elif time.monotonic() >= deadline:
                give_up()
    finally:
        sock.close(0)
    return report
