"""The delayer: adds a constant latency to a test host's packets from user space.

The kernel of the test machines has no ``tc netem`` (CONFIG_NET_SCH_NETEM is off) but it has
nfnetlink_queue, so latency is added here instead: an iptables rule in the host's network namespace
hands each packet to an NFQUEUE queue, this process holds the packet's id for the delay and then
gives it the ACCEPT verdict. Only the packet's metadata is copied to user space, never its payload.
It speaks nfnetlink_queue over a raw netlink socket (standard library only).

Usage, in the host's namespace (NFQUEUE queues are per network namespace)::

    ip netns exec NS iptables -A INPUT -i DEV -j NFQUEUE --queue-num 7 --queue-bypass
    ip netns exec NS python -m devtools.hosts.delayer --queue-num 7 --delay-ms 40

Delay what the host receives (INPUT), not what it sends (OUTPUT): a round trip grows by the delay
either way, but a packet held at OUTPUT still counts against its TCP socket's small-queue budget
(about 1 ms of data below the socket, freed only when the packet leaves), so a sender whose own data
is held gets ~0.1 MB/s at 40 ms. netem escapes that by orphaning the packets it delays; an NFQUEUE
user cannot, but a received packet is orphaned before the INPUT hook, and there bulk TCP keeps its speed.

It prints ``delayer: queue 7, 40 ms`` once bound and runs until SIGTERM or SIGINT (exit 0); on the
way out it accepts every packet it still holds. ``--queue-bypass`` lets packets pass while no
delayer is bound, so stopping the delayer removes the latency without touching the rule. A failure
is one line starting ``delayer error:`` (exit 2: bad arguments; exit 1: the kernel refused the bind,
e.g. not root or the queue is taken).
"""

from __future__ import annotations

import argparse
import collections
import errno
import math
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import NoReturn

NETLINK_NETFILTER = 12
SO_RCVBUFFORCE = 33  # Like SO_RCVBUF but past net.core.rmem_max: we run as root.
NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
# nfnetlink message types are (subsystem << 8) | type; the queue subsystem is 3.
NFQNL_MSG_PACKET, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0x300, 0x302, 0x303
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
# FAIL_OPEN: a full queue lets packets pass instead of dropping them. GSO: a large TCP segment
# is queued whole instead of cut in pieces, one message each (we never look at the payload).
NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_GSO = 0x1, 0x4
NF_ACCEPT = 1
QUEUE_MAXLEN = 8192
RCVBUF_BYTES = 8 << 20
RECVS_PER_WAKEUP = 256  # Bounds one read burst so due verdicts are not held back by a flood.


class DelayerError(Exception):
    """The kernel refused to set up the queue (the message names what it refused)."""


class DueQueue:
    """Packet ids in arrival order with their arrival times: which id is due at a time.

    The delay is the same for every packet, so packets fall due in arrival order and the answer is
    one id: the last one due, which a batch verdict accepts together with every id before it.

        due = DueQueue(0.040)
        due.add(5, arrived=10.0)
        due.next_due()        # 10.04
        due.release(10.05)    # 5 (and None until another packet falls due)
    """

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self._held: collections.deque[tuple[float, int]] = collections.deque()

    def __len__(self) -> int:
        return len(self._held)

    def add(self, packet_id: int, arrived: float) -> None:
        self._held.append((arrived + self.delay_s, packet_id))

    def next_due(self) -> float | None:
        return self._held[0][0] if self._held else None

    def release(self, now: float) -> int | None:
        """Forget the packets due at `now`; the id of the last of them, or None if none is due."""
        last = None
        while self._held and self._held[0][0] <= now:
            last = self._held.popleft()[1]
        return last

    def release_all(self) -> int | None:
        last = self._held[-1][1] if self._held else None
        self._held.clear()
        return last


def _attr(kind: int, payload: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(payload), kind) + payload + b"\0" * (-len(payload) % 4)


def _attrs(data: bytes) -> dict[int, bytes]:
    found, at = {}, 0
    while at + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, at)
        if length < 4:
            break
        found[kind & 0x3FFF] = data[at + 4 : at + length]  # Strip the nested/byte-order flags.
        at += (length + 3) & ~3
    return found


class Delayer:
    """Holds every packet of one NFQUEUE queue for `delay_s`, then accepts it.

    delayer = Delayer(queue_num=7, delay_s=0.040)
    delayer.bind()              # DelayerError if the kernel refuses (e.g. not root)
    delayer.serve_forever()     # returns after delayer.stop(), e.g. from a signal handler
    delayer.close()
    """

    def __init__(self, queue_num: int, delay_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.queue_num = queue_num
        self.clock = clock
        self.due = DueQueue(delay_s)
        self.lost_reads = 0  # ENOBUFS: the kernel dropped messages; a later batch verdict recovers them.
        self.refused_verdicts = 0  # Error acks for verdicts, e.g. packets flushed with their device.
        self._seq = 0
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)
        except PermissionError:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
        self._sock.bind((0, 0))

    def bind(self) -> None:
        # Bind and copy mode in one message: a packet queued in between would meet the default
        # copy mode NONE and be dropped.
        self._configure(
            "bind the queue",
            _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_UNSPEC))
            + _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
            + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN)),
        )
        flags = NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO
        try:
            self._configure(
                "set fail-open and GSO",
                _attr(NFQA_CFG_FLAGS, struct.pack("!I", flags))
                + _attr(NFQA_CFG_MASK, struct.pack("!I", flags)),
            )
        except DelayerError:
            pass  # Only an older kernel refuses; the delay works the same without them.

    def serve_forever(self) -> None:
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._stopping:
            due_at = self.due.next_due()
            wait_ms = -1 if due_at is None else max(0, math.ceil((due_at - self.clock()) * 1000))
            if any(fd == self._sock.fileno() for fd, _ in poller.poll(wait_ms)):
                self._read_packets()
            self._accept_up_to(self.due.release(self.clock()))
        # Stopping unbinds the queue, and the kernel drops what an unbound queue held.
        self._accept_up_to(self.due.release_all())

    def stop(self) -> None:
        """Make serve_forever return; safe from a signal handler or another thread."""
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # The pipe is full of earlier wake-ups: serve_forever is woken anyway.

    def close(self) -> None:
        self._sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _read_packets(self) -> None:
        for _ in range(RECVS_PER_WAKEUP):
            try:
                data = self._sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                # The lost packets stay queued in the kernel: the next batch verdict accepts them.
                self.lost_reads += 1
                continue
            for kind, body in self._messages(data):
                self._take(kind, body)

    def _take(self, kind: int, body: bytes) -> None:
        if kind == NFQNL_MSG_PACKET:
            (packet_id,) = struct.unpack_from("!I", _attrs(body[4:])[NFQA_PACKET_HDR])
            self.due.add(packet_id, self.clock())
        elif kind == NLMSG_ERROR and struct.unpack_from("=i", body)[0] != 0:
            self.refused_verdicts += 1

    def _accept_up_to(self, packet_id: int | None) -> None:
        if packet_id is not None:
            verdict = _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))
            self._send(NFQNL_MSG_VERDICT_BATCH, 0, verdict)

    def _configure(self, what: str, attrs: bytes) -> None:
        seq = self._send(NFQNL_MSG_CONFIG, NLM_F_ACK, attrs)
        while True:
            for kind, body in self._messages(self._sock.recv(65536)):
                if kind != NLMSG_ERROR or struct.unpack_from("=I", body, 12)[0] != seq:
                    self._take(kind, body)  # Packets flow as soon as the bind is done.
                    continue
                code = -struct.unpack_from("=i", body)[0]
                if code:
                    # EPERM also answers a bind of a queue that another process holds.
                    reason = "not root, or the queue is taken" if code == errno.EPERM else os.strerror(code)
                    raise DelayerError(f"the kernel refused to {what} for queue {self.queue_num}: {reason}")
                return

    def _send(self, kind: int, flags: int, attrs: bytes) -> int:
        self._seq += 1
        body = struct.pack("!BBH", socket.AF_UNSPEC, 0, self.queue_num) + attrs
        header = struct.pack("=IHHII", 16 + len(body), kind, NLM_F_REQUEST | flags, self._seq, 0)
        self._sock.sendto(header + body, (0, 0))
        return self._seq

    @staticmethod
    def _messages(data: bytes) -> list[tuple[int, bytes]]:
        """(type, body after the netlink header) of each netlink message in one datagram."""
        found, at = [], 0
        while at + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, at)
            if length < 16:
                break
            found.append((kind, data[at + 16 : at + length]))
            at += (length + 3) & ~3
        return found


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"delayer error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    parser = _OneLineParser(prog="python -m devtools.hosts.delayer", description="Delay a queue's packets.")
    parser.add_argument("--queue-num", type=int, required=True, help="NFQUEUE queue number (0-65535)")
    parser.add_argument("--delay-ms", type=float, required=True, help="latency added to every packet")
    args = parser.parse_args(argv)
    if not 0 <= args.queue_num <= 0xFFFF:
        parser.error(f"--queue-num {args.queue_num} is not in 0-65535")
    if not 0 <= args.delay_ms < math.inf:
        parser.error(f"--delay-ms {args.delay_ms:g} is not a finite number >= 0")
    try:
        delayer = Delayer(args.queue_num, args.delay_ms / 1000)
        delayer.bind()
    except (OSError, DelayerError) as exc:
        print(f"delayer error: cannot bind queue {args.queue_num}: {exc}", file=sys.stderr)
        return 1
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: delayer.stop())
    print(f"delayer: queue {args.queue_num}, {args.delay_ms:g} ms", flush=True)
    try:
        delayer.serve_forever()
    finally:
        delayer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
