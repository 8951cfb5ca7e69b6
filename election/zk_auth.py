"""ZooKeeper digest authentication: every member proves the cluster's credential, every node it creates is theirs alone.

``--zk-auth digest:USER:PASSWORD-FILE`` (or ``FENCEPOST_ZK_AUTH``) names a user and
a file holding its password (one line; never logged, never on a command line).
Every kazoo client fencepost opens (:func:`election.zk.connect`) then adds the
credential to its session and creates every znode with an ACL that gives that
user all rights and nobody else any: a client without the credential can neither
read nor change ``epoch``, ``log`` or ``leader``. Ensembles that also have TLS are
reached with kazoo's ``use_ssl`` (docs/security.md).

Nodes created before authentication was turned on keep their open ACL: secure a
cluster from its ``cluster init``.

Example::

    auth = ZkAuth.parse("digest:fencepost:/etc/fencepost/zk.password")
    KazooClient(hosts, auth_data=auth.auth_data(), default_acl=auth.acl())
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kazoo.security import make_digest_acl

from election import ElectionError

ENV = "FENCEPOST_ZK_AUTH"


class ZkAuthError(ElectionError):
    """A ``--zk-auth`` value or its password file is unusable."""


@dataclass(frozen=True)
class ZkAuth:
    """A digest user and its password (read from its file)."""

    user: str
    password: str = ""
    source: str = ""

    def __repr__(self) -> str:  # never show the password, in a log or a traceback
        return f"ZkAuth(user={self.user!r}, source={self.source!r})"

    @classmethod
    def parse(cls, spec: str) -> "ZkAuth":
        """``digest:USER:PASSWORD-FILE`` as a credential; :class:`ZkAuthError` names what is wrong."""
        scheme, _, rest = spec.partition(":")
        user, _, password_file = rest.partition(":")
        if scheme != "digest" or not user or not password_file:
            raise ZkAuthError("--zk-auth is digest:USER:PASSWORD-FILE (the password is read from the file)")
        if ":" in user:
            raise ZkAuthError("a ZooKeeper digest user cannot contain ':'")
        try:
            password = Path(password_file).read_text().strip()
        except OSError as exc:
            raise ZkAuthError(
                f"cannot read the ZooKeeper password file {password_file}: {exc.strerror or exc}"
            ) from None
        if not password:
            raise ZkAuthError(f"the ZooKeeper password file {password_file} is empty")
        return cls(user, password, password_file)

    @classmethod
    def from_env(cls) -> "ZkAuth | None":
        spec = os.environ.get(ENV)
        return cls.parse(spec) if spec else None

    def auth_data(self) -> list[tuple[str, str]]:
        return [("digest", f"{self.user}:{self.password}")]

    def acl(self) -> list:
        return [make_digest_acl(self.user, self.password, all=True)]
