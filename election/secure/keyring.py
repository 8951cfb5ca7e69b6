"""A secure cluster's keys in a running process: what a server serves with, what a client connects with.

A server is secure when it is given its own secret key (``key_file``) and the
cluster's keys file (``keys_file``): :class:`ServerKeys` checks that its key has
the server's role, starts the ZAP thread (:class:`election.secure.curve.KeyRingAuthenticator`)
on the socket's context, makes the ROUTER a CURVE server and reloads the keys
file on SIGHUP (:func:`reload_on_sighup`).

A client is secure when it has a key and the keys file: :class:`ClientKeys`.
It finds the public key of the server it connects to by one rule: **a server's
line in the keys file is named after the address clients reach it at**, without
``tcp://`` (the broker advertised as ``tcp://10.0.0.5:5601`` is the line
``broker 10.0.0.5:5601 KEY``), and it must have a server role (``broker`` or
``bookie``). A client pins that key, so a process at that address without the
matching secret cannot complete the handshake. The same rule works whether the
address came from ZooKeeper, a ``not_leader`` redirect or a ``brokers=[...]`` list.

A process's own default client keys (:func:`process_keys`) are what the bookie
pool and one-off requests use when not told otherwise: a broker or bookie sets
them to its own key at start; elsewhere they come from ``FENCEPOST_KEY_FILE``
and ``FENCEPOST_KEYS_FILE`` (the CLI's ``--key-file`` / ``--keys-file`` set those).

Example::

    keys = load_client_keys("me.secret", "cluster.keys")   # None when neither is given
    sock = ctx.socket(zmq.DEALER)
    if keys is not None:
        keys.secure(sock, "tcp://10.0.0.5:5601")           # pins the key named 10.0.0.5:5601
    sock.connect("tcp://10.0.0.5:5601")
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import field
from pathlib import Path
from typing import Any, Mapping

import zmq

from election.secure.curve import KeyRingAuthenticator, make_client, make_server
from election.secure.keys import KeyPair, KeyRing, KeysError, read_key_pair

log = logging.getLogger(__name__)

ENV_KEY_FILE = "FENCEPOST_KEY_FILE"
ENV_KEYS_FILE = "FENCEPOST_KEYS_FILE"
SERVER_ROLES = ("broker", "bookie")


def server_name(address: str) -> str:
    """The keys-file name of the server at ``address``: ``tcp://10.0.0.5:5601`` -> ``10.0.0.5:5601``."""
    return address.removeprefix("tcp://")


class ClientKeys:
    """A client's key pair and the keys file it pins servers' keys from."""

    def __init__(self, pair: KeyPair, ring: KeyRing) -> None:
        self.pair, self.ring = pair, ring

    def server_public(self, address: str, roles: tuple[str, ...] = SERVER_ROLES) -> bytes:
        """The public key to pin for ``address``; :class:`KeysError` when the keys file lists none."""
        name = server_name(address)
        entry = self.ring.by_name(name)
        if entry is None:
            raise KeysError(
                f"the keys file {self.ring.path} has no line named {name!r}: a secure server's line is "
                f"named after its address, so {address} cannot be trusted"
            )
        if entry.role not in roles:
            raise KeysError(
                f"{name!r} in {self.ring.path} has role {entry.role}, not {' or '.join(roles)}: "
                f"refusing to talk to {address}"
            )
        return entry.public

    def secure(self, sock: zmq.Socket, address: str, roles: tuple[str, ...] = SERVER_ROLES) -> None:
        """Make ``sock`` a CURVE client pinned to the server at ``address`` (before ``connect``)."""
        make_client(sock, self.pair, self.server_public(address, roles))


def load_client_keys(
    key_file: str | os.PathLike | None = None,
    keys_file: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
) -> ClientKeys | None:
    """The keys given, else ``FENCEPOST_KEY_FILE`` / ``FENCEPOST_KEYS_FILE``; None when there are none (plain)."""
    env = os.environ if env is None else env
    key_file = key_file or env.get(ENV_KEY_FILE) or None
    keys_file = keys_file or env.get(ENV_KEYS_FILE) or None
    if key_file is None and keys_file is None:
        return None
    if key_file is None or keys_file is None:
        missing = (
            "a key file (key_file, FENCEPOST_KEY_FILE)"
            if key_file is None
            else "the keys file (keys_file, FENCEPOST_KEYS_FILE)"
        )
        raise KeysError(f"a secure client needs its key and the cluster's keys file: {missing} is missing")
    return ClientKeys(read_key_pair(Path(key_file)), KeyRing(Path(keys_file)))


_process: dict[str, ClientKeys | None] = {}
_process_lock = threading.Lock()


def process_keys() -> ClientKeys | None:
    """This process's default client keys: set by :func:`set_process_keys`, else read once from the environment."""
    with _process_lock:
        if "keys" not in _process:
            _process["keys"] = load_client_keys()
        return _process["keys"]


def set_process_keys(keys: ClientKeys | None) -> None:
    """Make ``keys`` what this process's bookie pools and one-off requests connect with."""
    with _process_lock:
        _process["keys"] = keys


class ServerKeys:
    """A secure server's key, its keys file and the ZAP thread answering from it."""

    def __init__(self, context: zmq.Context, key_file: str, keys_file: str, role: str) -> None:
        self.pair = read_key_pair(Path(key_file))
        if self.pair.role != role:
            raise KeysError(f"{key_file} is a {self.pair.role} key; a {role} serves with a {role} key")
        self.ring = KeyRing(Path(keys_file))
        self.auth = KeyRingAuthenticator(context, self.ring)
        self.auth.start()

    def secure(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE server checked by the ZAP thread (before ``bind``)."""
        make_server(sock, self.pair)

    def client_keys(self) -> ClientKeys:
        """This server's key as a client of the others (a broker's bookie pool, a bookie's re-replication)."""
        return ClientKeys(self.pair, self.ring)

    def reload(self) -> None:
        """Read the keys file again; a file that does not parse keeps the previous keys (and says why)."""
        try:
            count = self.ring.reload()
        except KeysError as exc:
            log.error("keys file not reloaded, the previous keys stay in force: %s", exc)
            return
        log.warning("keys file %s reloaded: %d keys", self.ring.path, count)

    def stop(self) -> None:
        self.auth.stop()


def reload_on_sighup(keys: ServerKeys) -> None:
    """Reload ``keys`` on SIGHUP (main thread only; the reload runs on its own thread, never in the handler)."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(
        signal.SIGHUP,
        lambda *_: threading.Thread(target=keys.reload, name="keys-reload", daemon=True).start(),
    )


def keys_file_field() -> Any:
    """The ``keys_file`` setting of a server's config dataclass."""
    return field(
        default="",
        metadata={
            "help": "The cluster's keys file (docs/security.md). With key_file the server is secure: CURVE-encrypted "
            "sockets, every client's key checked against this file (reloaded on SIGHUP) and its role's "
            "rights enforced.",
            "path": "file",
        },
    )


def key_file_field() -> Any:
    """The ``key_file`` setting of a server's config dataclass."""
    return field(
        default="",
        metadata={
            "help": "This server's secret key file (`fencepost keys new --role broker` or `--role bookie`); "
            "with keys_file the server is secure.",
            "path": "file",
        },
    )


def check_secure_settings(config: Any, error: type[Exception]) -> None:
    """Both ``key_file`` and ``keys_file``, or neither: half a secure server would refuse everyone."""
    if bool(config.key_file) != bool(config.keys_file):
        raise error(
            "a secure server needs both key_file (its secret key) and keys_file (the cluster's keys); "
            f"only {'key_file' if config.key_file else 'keys_file'} is set"
        )
