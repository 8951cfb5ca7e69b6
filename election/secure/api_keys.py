"""API keys of the HTTP API (`fencepost api`): bearer tokens with the roles of CURVE keys.

An API key is a random token (``fpk_`` + 43 URL-safe characters, 256 bits) that a
program sends as ``Authorization: Bearer KEY``. The server never holds the key
itself: its API keys file lists the SHA-256 of each key, with the key's role
(the roles of :mod:`election.secure.roles`) and name, one per line::

    # role     name        sha256 of the key
    producer   shop        sha256:6d1f...e0 (64 hex digits)
    admin      ops         sha256:0b9c...7a

A plain hash is enough, unlike for passwords: a key has 256 random bits, so no
dictionary reaches it, and checking a request costs one hash. The file is its
own (``api.keys``), not a section of the CURVE keys file, so brokers and bookies of
any version keep parsing theirs. ``fencepost keys new --api NAME --role ROLE``
appends a line (:func:`add_api_key`) and hands the key out once; a key never
appears in a log or an error message (:class:`ApiKeyEntry` holds only the hash).

:class:`ApiKeyRing` is what a server checks against: it reads the file again when
it changes (checked at most once a second), and a file that does not parse keeps
the previous keys (the error is logged, naming the line).

Example::

    key = add_api_key(Path("api.keys"), "producer", "shop")     # "fpk_..." (shown once)
    ring = ApiKeyRing(Path("api.keys"))
    ring.lookup(key)      # ApiKeyEntry(role="producer", name="shop", ...) or None
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from election.local.clock import SYSTEM_CLOCK, Clock
from election.secure.keys import NAME, KeysError

log = logging.getLogger(__name__)

KEY_PREFIX = "fpk_"
# The roles an API key may have: a program's, not a cluster member's (broker and bookie keys are
# members' identities, and a member never comes through the HTTP API).
API_ROLES = ("producer", "worker", "admin")
_HASH = re.compile(r"\Asha256:[0-9a-f]{64}\Z")
_KEY = re.compile(r"\Afpk_[A-Za-z0-9_-]{43}\Z")
HEADER = "# role     name        sha256 of the key (fencepost keys new --api)\n"
RELOAD_CHECK_S = 1.0


@dataclass(frozen=True)
class ApiKeyEntry:
    """One accepted API key: its role, name and hash (never the key)."""

    role: str
    name: str
    digest: str
    line: int = 0


def new_api_key() -> str:
    """A fresh API key (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_digest(key: str) -> str:
    """What the API keys file stores for ``key``: ``sha256:`` and 64 hex digits."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def looks_like_key(key: str) -> bool:
    """Whether ``key`` has an API key's form (a quick refusal before hashing anything longer)."""
    return bool(_KEY.match(key))


def parse_api_keys_file(text: str, source: str = "API keys file") -> dict[str, ApiKeyEntry]:
    """The keys of an API keys file's text, by digest; :class:`KeysError` names a bad line."""
    entries: dict[str, ApiKeyEntry] = {}
    names: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 3:
            raise KeysError(f"{source} line {number}: expected ROLE NAME sha256:HEX, got {len(parts)} fields")
        role, name, digest = parts
        if role not in API_ROLES:
            raise KeysError(f"{source} line {number}: role {role!r} is not one of {', '.join(API_ROLES)}")
        if not NAME.match(name):
            raise KeysError(f"{source} line {number}: invalid key name {name!r}")
        if not _HASH.match(digest):
            raise KeysError(f"{source} line {number}: expected sha256: and 64 lowercase hex digits")
        if name in names:
            raise KeysError(
                f"{source} line {number}: the name {name!r} is already used on line {names[name]}"
            )
        if digest in entries:
            raise KeysError(
                f"{source} line {number}: the same key is already listed on line {entries[digest].line}"
            )
        names[name] = number
        entries[digest] = ApiKeyEntry(role, name, digest, number)
    return entries


def read_api_keys_file(path: Path) -> dict[str, ApiKeyEntry]:
    """The keys of the file at ``path`` (:class:`KeysError` if unreadable or malformed)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise KeysError(f"cannot read the API keys file {path}: {exc.strerror or exc}") from None
    return parse_api_keys_file(text, str(path))


def add_api_key(path: Path, role: str, name: str) -> str:
    """Make a key for ``role`` named ``name``, append its line to the API keys file (created mode 0600
    if missing) and return the key: the only time it is seen."""
    if role not in API_ROLES:
        raise KeysError(f"an API key's role is one of {', '.join(API_ROLES)}, not {role!r}")
    if not NAME.match(name or ""):
        raise KeysError(f"invalid key name {name!r}: letters, digits and _.:- (up to 128)")
    path = Path(path)
    existing = read_api_keys_file(path) if path.exists() else {}
    if any(entry.name == name for entry in existing.values()):
        raise KeysError(f"{path} already has a key named {name!r}: remove its line first to replace it")
    key = new_api_key()
    path.parent.mkdir(parents=True, exist_ok=True)
    new_file = not path.exists() or path.stat().st_size == 0
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as fh:
        if new_file:
            fh.write(HEADER)
        fh.write(f"{role:<10} {name:<11} {key_digest(key)}\n")
        fh.flush()
        os.fsync(fh.fileno())
    return key


def write_key_file(key: str, path: Path) -> Path:
    """Write ``key`` alone to ``path`` (mode 0600, created that way; never overwritten)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeysError(f"{path} exists: keys are never overwritten") from None
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return path


class ApiKeyRing:
    """The API keys a server accepts, read again when the file changes (see the module docstring)."""

    def __init__(self, path: Path, clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = Path(path)
        self._clock = clock
        self._lock = threading.Lock()
        self._entries = read_api_keys_file(self.path)
        self._seen = self._signature()
        self._checked = clock.monotonic()

    def _signature(self) -> tuple | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _maybe_reload(self) -> None:
        now = self._clock.monotonic()
        if now - self._checked < RELOAD_CHECK_S or not self._lock.acquire(blocking=False):
            return
        try:
            self._checked = now
            signature = self._signature()
            if signature == self._seen:
                return
            self._seen = signature
            try:
                self._entries = read_api_keys_file(self.path)
                log.info("API keys file %s read again: %d keys", self.path, len(self._entries))
            except KeysError as exc:
                log.error("API keys file not reloaded, the previous keys stay in force: %s", exc)
        finally:
            self._lock.release()

    def lookup(self, key: str) -> ApiKeyEntry | None:
        """The entry of ``key``, or None for a key the file does not list."""
        self._maybe_reload()
        if not looks_like_key(key):
            return None
        return self._entries.get(key_digest(key))

    def __len__(self) -> int:
        return len(self._entries)
