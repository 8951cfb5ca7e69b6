"""Talking to a real bookie in tests: a raw DEALER client and well-formed entries."""

from __future__ import annotations

import itertools

import zmq

from election import wire
from ledger.codec import Digest, Entry, encode_entry

DIGEST = Digest.crc32c()


def entry(ledger: int, entry_id: int, lac: int = -1, payload: bytes | None = None) -> bytes:
    payload = payload if payload is not None else f"payload {ledger}/{entry_id}".encode()
    return encode_entry(Entry(ledger, entry_id, lac, 1, payload), DIGEST)


class Client:
    """A DEALER socket with a timeout on every receive: a test never hangs on a silent bookie."""

    def __init__(self, address: str, timeout_ms: int = 5000) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
        self.sock.connect(address)
        self._rids = itertools.count(1)

    def send(self, op: str, **fields) -> int:
        rid = next(self._rids)
        self.sock.send(wire.encode(wire.request(op, rid, **fields)))
        return rid

    def send_raw(self, frame: bytes) -> None:
        self.sock.send(frame)

    def recv(self, timeout_ms: int | None = None) -> dict:
        if timeout_ms is not None and not self.sock.poll(timeout_ms, zmq.POLLIN):
            raise AssertionError(f"no reply within {timeout_ms} ms")
        return wire.decode(self.sock.recv())

    def call(self, op: str, **fields) -> dict:
        rid = self.send(op, **fields)
        reply = self.recv()
        assert reply["rid"] == rid
        return reply

    def close(self) -> None:
        self.sock.close(linger=0)
