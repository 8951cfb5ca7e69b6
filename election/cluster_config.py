"""The cluster's `config` node: its id and the options every member must share.

The first process that finds no `config` node creates it (a uuid4 `cluster_id`,
which is the store's initial signature, plus the options); every later member
reads it and compares its own options, aborting with each difference named.

Example::

    options = ClusterOptions(write_quorum=3, ack_quorum=2, ensemble_size=3)
    config = ensure_cluster_config(zk, ClusterPaths("dev"), options, clock=time.time)
    config["cluster_id"]
"""
from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from election import ElectionError
from election.paths import ClusterPaths

FORMAT_VERSION = 1
DIGESTS = ("crc32c", "hmac-sha256")


class ConfigMismatch(ElectionError):
    """This member's options differ from the cluster's; ``differences`` names each."""

    def __init__(self, differences: list[str]) -> None:
        super().__init__("options differ from the cluster's: " + "; ".join(differences))
        self.differences = differences


@dataclass(frozen=True)
class ClusterOptions:
    """Options that must be identical on every member of a cluster."""

    write_quorum: int = 3
    ack_quorum: int = 2
    ensemble_size: int = 3
    digest: str = "crc32c"
    max_payload_bytes: int = 1024 * 1024
    format_version: int = FORMAT_VERSION

    def validate(self) -> "ClusterOptions":
        if not 1 <= self.ack_quorum <= self.write_quorum <= self.ensemble_size:
            raise ElectionError(
                "need 1 <= ack_quorum <= write_quorum <= ensemble_size, got "
                f"{self.ack_quorum}/{self.write_quorum}/{self.ensemble_size}"
            )
        if self.write_quorum != self.ensemble_size:
            raise ElectionError("striping is not supported: write_quorum must equal ensemble_size")
        if self.digest not in DIGESTS:
            raise ElectionError(f"digest must be one of {', '.join(DIGESTS)}, got {self.digest!r}")
        if not 1 <= self.max_payload_bytes <= 64 * 1024 * 1024:
            raise ElectionError("max_payload_bytes must be between 1 and 64 MiB")
        return self

    def differences(self, config: dict) -> list[str]:
        """Each option whose value in `config` differs from ours, as readable text."""
        out = []
        for name, mine in asdict(self).items():
            theirs = config.get(name)
            if theirs != mine:
                out.append(f"{name}: cluster has {theirs!r}, this member has {mine!r}")
        return out


def read_cluster_config(zk: KazooClient, paths: ClusterPaths) -> dict | None:
    """The cluster's config, or None if the cluster was never initialized."""
    try:
        data, _ = zk.get(paths.config)
    except NoNodeError:
        return None
    return json.loads(data)


def ensure_cluster_config(
    zk: KazooClient,
    paths: ClusterPaths,
    options: ClusterOptions,
    clock: Callable[[], float],
    check: bool = True,
) -> dict:
    """Create the config node if absent, then return it.

    With ``check`` the options are compared and :class:`ConfigMismatch` names
    every difference. Creation races are settled by ZooKeeper: the loser reads
    what the winner wrote.
    """
    options.validate()
    config = read_cluster_config(zk, paths)
    if config is None:
        fresh = {"cluster_id": str(uuid.uuid4()), "created_at": clock(), **asdict(options)}
        zk.ensure_path(paths.base)
        try:
            zk.create(paths.config, json.dumps(fresh).encode())
            config = fresh
        except NodeExistsError:
            config = read_cluster_config(zk, paths)
    if check:
        differences = options.differences(config)
        if differences:
            raise ConfigMismatch(differences)
    return config
