"""CURVE keys and the cluster's keys file: who may connect, and in which role.

A member or a client holds one key pair, made by ``fencepost keys new``: a
secret file (mode 0600, never sent, never logged) and a public line. A cluster's
keys file lists every public key it accepts, one per line::

    # role     name        public key (Z85, 40 characters)
    broker     broker-0    rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7
    worker     thumbnails  Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID

Servers load it at start and again on SIGHUP (:class:`KeyRing` swaps the table in
one assignment, so a lookup never sees half a file); a file that does not parse
keeps the previous table and says which line is wrong. Servers and clients
also read their peers' public keys from it (a client pins a broker's key, so a
rogue server is refused).

Example::

    pair = new_key_pair("worker", "thumbnails")
    write_key_pair(pair, Path("keys"))          # keys/thumbnails.secret, keys/thumbnails.public
    ring = KeyRing(Path("cluster.keys"))
    ring.lookup(pair.public)                     # KeyEntry(role="worker", name="thumbnails", ...) or None
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import zmq

from election import ElectionError

ROLES = ("producer", "worker", "admin", "broker", "bookie")
Z85_KEY = re.compile(r"\A[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}\Z")
NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z")
SECRET_MODE = 0o600


class KeysError(ElectionError):
    """A key file, a keys file or a key is unusable; the message names the file and the line."""


@dataclass(frozen=True)
class KeyEntry:
    """One accepted public key: its role and name (the keys file's line number, for messages)."""

    role: str
    name: str
    public: bytes
    line: int = 0


@dataclass(frozen=True)
class KeyPair:
    """A key pair with its role and name; ``secret`` is None when only the public half is known."""

    role: str
    name: str
    public: bytes
    secret: bytes | None = None

    def public_line(self) -> str:
        """The keys-file line that admits this key."""
        return f"{self.role:<9} {self.name:<11} {self.public.decode()}"


def _check_role(role: str) -> str:
    if role not in ROLES:
        raise KeysError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    return role


def _check_name(name: str) -> str:
    if not NAME.match(name or ""):
        raise KeysError(
            f"invalid key name {name!r}: letters, digits and _.:- (up to 128), starting with a letter "
            "or digit"
        )
    return name


def new_key_pair(role: str, name: str) -> KeyPair:
    """A fresh CURVE key pair for ``role``, named ``name``."""
    public, secret = zmq.curve_keypair()
    return KeyPair(_check_role(role), _check_name(name), public, secret)


def write_key_pair(pair: KeyPair, out_dir: Path) -> tuple[Path, Path]:
    """Write ``NAME.secret`` (mode 0600, created that way: never readable by others) and ``NAME.public``."""
    if pair.secret is None:
        raise KeysError("a key pair without its secret cannot be written")
    out_dir.mkdir(parents=True, exist_ok=True)
    secret_path, public_path = out_dir / f"{pair.name}.secret", out_dir / f"{pair.name}.public"
    for path in (secret_path, public_path):
        if path.exists():
            raise KeysError(f"{path} exists: keys are never overwritten (remove it first to replace the key)")
    body = (
        json.dumps(
            {
                "role": pair.role,
                "name": pair.name,
                "public": pair.public.decode(),
                "secret": pair.secret.decode(),
            },
            indent=1,
        )
        + "\n"
    )
    fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, SECRET_MODE)
    with os.fdopen(fd, "w") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    public_path.write_text(pair.public_line() + "\n")
    return secret_path, public_path


def read_key_pair(path: Path) -> KeyPair:
    """The key pair of a secret file; refused if others may read it (a leaked secret is no secret)."""
    try:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise KeysError(f"{path} is readable by others (mode {mode:o}): chmod 600 it")
        doc = json.loads(path.read_text())
        pair = KeyPair(
            _check_role(doc["role"]), _check_name(doc["name"]), doc["public"].encode(), doc["secret"].encode()
        )
    except OSError as exc:
        raise KeysError(f"cannot read the key file {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise KeysError(f"{path} is not a fencepost secret key file (made by `fencepost keys new`)") from None
    if not (Z85_KEY.match(pair.public.decode()) and Z85_KEY.match(pair.secret.decode())):
        raise KeysError(f"{path}: the keys are not 40-character Z85 CURVE keys")
    if zmq.curve_public(pair.secret) != pair.public:
        raise KeysError(f"{path}: the public key does not belong to the secret key")
    return pair


def parse_keys_file(text: str, source: str = "keys file") -> dict[bytes, KeyEntry]:
    """The accepted keys of a keys file's text, by public key; :class:`KeysError` names a bad line."""
    entries: dict[bytes, KeyEntry] = {}
    names: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):  # whole-line comments only: '#' is a Z85 character
            continue
        parts = line.split()
        if len(parts) != 3:
            raise KeysError(f"{source} line {number}: expected ROLE NAME PUBLIC-KEY, got {len(parts)} fields")
        role, name, public = parts
        try:
            _check_role(role)
            _check_name(name)
        except KeysError as exc:
            raise KeysError(f"{source} line {number}: {exc}") from None
        if not Z85_KEY.match(public):
            raise KeysError(
                f"{source} line {number}: {public[:12]!r}... is not a 40-character Z85 public key"
            )
        if public.encode() in entries:
            raise KeysError(
                f"{source} line {number}: the key of {name!r} is already listed on line "
                f"{entries[public.encode()].line}"
            )
        if name in names:
            raise KeysError(
                f"{source} line {number}: the name {name!r} is already used on line {names[name]}"
            )
        names[name] = number
        entries[public.encode()] = KeyEntry(role, name, public.encode(), number)
    return entries


class KeyRing:
    """The keys file of a running server or client, reloadable (SIGHUP) without a restart."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()  # one reload at a time; lookups read one attribute and take no lock
        self._entries = self._load()

    def _load(self) -> dict[bytes, KeyEntry]:
        try:
            text = self.path.read_text()
        except OSError as exc:
            raise KeysError(f"cannot read the keys file {self.path}: {exc.strerror or exc}") from None
        return parse_keys_file(text, str(self.path))

    def reload(self) -> int:
        """Read the file again; on an error the previous keys stay in force (and the error is raised)."""
        with self._lock:
            entries = self._load()
            self._entries = entries
            return len(entries)

    def lookup(self, public: bytes) -> KeyEntry | None:
        return self._entries.get(public)

    def by_name(self, name: str) -> KeyEntry | None:
        return next((e for e in self._entries.values() if e.name == name), None)

    def with_role(self, role: str) -> list[KeyEntry]:
        return [e for e in self._entries.values() if e.role == role]

    def __len__(self) -> int:
        return len(self._entries)
