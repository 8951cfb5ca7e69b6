"""Keys of a secure dev cluster (`fencepost dev up --secure`): one per member, an admin key, one keys file.

Every member's key is named after its address (the rule clients pin servers by,
:mod:`election.secure.keyring`), with its kind as role; the admin key is what CLI
commands pointed at the dev directory connect with. Everything lives in
``DEV_DIR/keys/`` and the keys file is ``DEV_DIR/cluster.keys``; the paths are
recorded in ``cluster.json`` (``keys_file``, ``admin_key_file``, each member's
``key_file``). A broker added later gets its key appended, and the running
members are told to reload (SIGHUP) before it starts.

Example::

    keys = DevKeys(Path(".fencepost-dev"))
    keys.create()                                        # keys/admin.secret, cluster.keys (afresh)
    key_file = keys.add_member("bookie", "tcp://127.0.0.1:4181")
    args = keys.member_args(key_file)                     # ["--key-file", ..., "--keys-file", ...]
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

from election.secure.keyring import server_name
from election.secure.keys import new_key_pair, write_key_pair

KEYS_DIR = "keys"
KEYS_FILE = "cluster.keys"
ADMIN = "admin"


class DevKeys:
    """The key files of one dev cluster's run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = Path(run_dir).resolve() / KEYS_DIR
        self.keys_file = Path(run_dir).resolve() / KEYS_FILE

    @property
    def admin_key_file(self) -> Path:
        return self.dir / f"{ADMIN}.secret"

    def create(self) -> None:
        """A fresh admin key and a keys file listing only it (a fresh `up` picks new ports, so new member keys)."""
        shutil.rmtree(self.dir, ignore_errors=True)
        pair = new_key_pair("admin", ADMIN)
        write_key_pair(pair, self.dir)
        self.keys_file.write_text("# role     name        public key (Z85)\n" + pair.public_line() + "\n")

    def add_member(self, kind: str, address: str) -> Path:
        """A new ``kind`` key named after ``address``, appended to the keys file; its secret file."""
        pair = new_key_pair(kind, server_name(address))
        secret, _public = write_key_pair(pair, self.dir)
        with self.keys_file.open("a") as fh:
            fh.write(pair.public_line() + "\n")
        return secret

    def member_args(self, key_file: Path) -> list[str]:
        """The `bookie start` / `broker start` arguments of a member serving with ``key_file``."""
        return ["--key-file", str(key_file), "--keys-file", str(self.keys_file)]

    def record(self, state: dict) -> None:
        """Note the keys in ``cluster.json``'s state (CLI commands at this dev dir then use the admin key)."""
        state.update(secure=True, keys_file=str(self.keys_file), admin_key_file=str(self.admin_key_file))


def reload_members(pids: list[int]) -> None:
    """Tell running members to read the keys file again (a member that is gone is skipped)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGHUP)
        except (ProcessLookupError, PermissionError):
            continue
