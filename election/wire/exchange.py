"""One request on a fresh socket: the one-off exchange of tools, joiners and tests.

Clients that follow the leader keep their sockets (:class:`broker.api.client.Client`,
the ledger's bookie pool). This is for talking to one named server once: a
readiness ping, a status report, a snapshot chunk for a joiner. The reply comes
back as it is, error replies included; only silence is an exception.

In a secure cluster the socket connects with the process's keys
(:func:`election.secure.keyring.process_keys`: a member's own key, a tool's
``--key-file``) and pins the server's key from the keys file.

Example::

    reply = exchange("tcp://127.0.0.1:5601", "status", timeout=2.0)
    if not reply["ok"]:
        print(reply["error"], reply["message"])
"""

from __future__ import annotations

from typing import Any

import zmq

from election import wire
from election.secure.keyring import ClientKeys, process_keys
from election.wire import codes

# Said when a server stays silent to a client without keys: a secure server never answers one.
PLAIN_HINT = " (a secure cluster answers only clients with a key: --key-file and --keys-file)"


class NoReply(wire.CodedError, code=codes.E_NO_REPLY):
    """The server did not answer in time, or the socket failed."""


def exchange(
    address: str,
    op: str,
    timeout: float = 2.0,
    max_bytes: int = wire.DEFAULT_MAX_FRAME_BYTES,
    keys: ClientKeys | None = None,
    **fields: Any,
) -> dict:
    """Send one ``op`` request to ``address`` and return the decoded reply map (ok or not).

    Raises :class:`NoReply` after ``timeout`` seconds of silence or on a socket
    error, :class:`election.wire.WireError` if the reply is not a valid frame, and
    :class:`election.secure.keys.KeysError` if the keys file does not name the server.
    ``keys`` defaults to the process's (None in a plain process).
    """
    keys = keys or process_keys()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        if keys is not None:
            keys.secure(sock, address)
        sock.connect(address)
        sock.send(wire.encode(wire.request(op, 1, **fields)))
        if not sock.poll(int(timeout * 1000)):
            raise NoReply(
                codes.E_NO_REPLY,
                f"{address} did not answer {op} within {timeout:g}s"
                + ("" if keys is not None else PLAIN_HINT),
            )
        return wire.decode(sock.recv(), max_bytes=max_bytes)
    except zmq.ZMQError as exc:
        raise NoReply(codes.E_NO_REPLY, f"{address}: {exc}") from None
    finally:
        sock.close()
