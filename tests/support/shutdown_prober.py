"""Submits straight to one broker until stopped, recording what came back (a cluster shutdown's refusals).

:class:`ShutdownProber` keeps at least :data:`PROBES_IN_FLIGHT` requests unanswered (pipelined on
one DEALER socket) and sends one more each millisecond, recording ``(rid, error code or None)`` of
each reply. A cluster shutdown's leader refuses writes only between the shutdown request and its
last entry: a few milliseconds, unless its brokers run with ``FENCEPOST_FAULT_HOLD_SHUTDOWN_ENTRY_S``
(:mod:`broker.server.leading.leader_shutdown`), which is what makes the window wide enough to meet on
a busy machine. A backlog alone can miss it (every request of it may be in the leader's last group,
and the next ones go only when their replies come); the steady trickle keeps a request arriving
during the window. A broker that stopped answering gets at most :data:`PROBES_UNANSWERED_MAX`
requests.

Example::

    with ShutdownProber(leader.address) as prober:
        run_shutdown(...)
    refused = [rid for rid, code in prober.replies if code == codes.E_SHUTTING_DOWN]
"""

from __future__ import annotations

import itertools
import threading

import zmq

from election import wire

PROBES_IN_FLIGHT = 32
PROBES_UNANSWERED_MAX = 5000


def probe(address: str, halt: threading.Event, replies: list) -> None:
    """Probe ``address`` until ``halt`` is set, appending ``(rid, code)`` of every reply to ``replies``."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    rids, unanswered = itertools.count(1), 0
    try:
        while not halt.is_set():
            wanted = max(PROBES_IN_FLIGHT - unanswered, 1 if unanswered < PROBES_UNANSWERED_MAX else 0)
            for _ in range(wanted):
                rid = next(rids)
                request = wire.request("submit", rid, queue="probe", payload=b"p", key=f"probe-{rid}")
                try:
                    sock.send(wire.encode(request), zmq.NOBLOCK)
                except zmq.Again:  # the broker is gone and its pipe is full
                    break
                unanswered += 1
            while sock.poll(1):
                reply = wire.decode(sock.recv())
                replies.append((reply["rid"], None if reply.get("ok") else reply.get("error")))
                unanswered -= 1
    finally:
        sock.close()


class ShutdownProber:
    """The prober's thread, started on enter and stopped on exit; :attr:`replies` as they came."""

    def __init__(self, address: str) -> None:
        self.replies: list[tuple[int, str | None]] = []
        self._halt = threading.Event()
        self._thread = threading.Thread(target=probe, args=(address, self._halt, self.replies), daemon=True)

    def __enter__(self) -> "ShutdownProber":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._halt.set()
        self._thread.join(10)
