"""What ``fencepost dev up`` starts (:class:`DevClusterSpec`), and the cluster config it makes from it.

A spec names the cluster, how many bookies and brokers (and ZooKeeper servers), the brokers' ZooKeeper
session timeout and ``--wait-for``, extra bookie arguments, whether every socket is
CURVE (``secure``) and the cluster-wide options `up` gives `cluster init` before
any member starts (quorums, digest, payload limit, shards; None: init's default, or
what an existing config says). :func:`init_cluster_config` runs that `cluster init` in
process; over a cluster that already has a config it keeps it when the spec
agrees with it and raises :class:`DevClusterError` naming each difference.

Example::

    spec = DevClusterSpec(bookies=4, digest="hmac-sha256", secret_file="secret").validate()
    init_cluster_config("127.0.0.1:2181", spec, read_secret_file("secret"), "secret")
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from broker import BrokerError
from devtools.zk_ensemble import check_server_count
from election import ElectionError
from election.cluster_config import (
    SHARED_OPTIONS,
    ClusterAlreadyInitialized,
    ClusterOptions,
    check_member_secret,
    check_secret_choice,
    cluster_shards,
    init_cluster,
    option_differences,
    read_cluster_config,
    read_secret,
)
from election.paths import ClusterPaths, check_cluster_name
from election.shards import MAX_SHARDS

# One more bookie than the default ensemble (3): with one bookie dead a new ledger still finds
# three, so a broker failover or a ledger roll needs no operator.
DEFAULT_BOOKIES = 4
DEFAULT_BROKERS = 3
E_ZK_SERVERS_ON_HOSTS = (
    "--zk-servers > 1 cannot go with --hosts: on test hosts ZooKeeper is one server on host zk "
    "(an ensemble runs on 127.0.0.1 only)"
)


class DevClusterError(BrokerError):
    """The local development cluster could not be started, read or stopped."""


@dataclass
class DevClusterSpec:
    """What `dev up` starts."""

    cluster: str = "dev"
    # None: one per host on test hosts, else DEFAULT_BOOKIES bookies and DEFAULT_BROKERS brokers.
    bookies: int | None = None
    brokers: int | None = None
    zk_session_timeout: float = 2.0
    # Fault-injection runs only: brokers expose their ZooKeeper session in <data>.zk-session.
    session_files: bool = False
    # The cluster-wide options `up` gives `cluster init` (None: init's default, or the existing config's).
    write_quorum: int | None = None
    ack_quorum: int | None = None
    ensemble_size: int | None = None
    digest: str | None = None
    max_payload_bytes: int | None = None
    # `cluster init --shards S` (None: 1, or the existing config's): every broker runs one process per shard.
    shards: int | None = None
    # The cluster secret (for hmac-sha256): handed to `cluster init` and to every broker.
    secret_file: str | None = None
    # `broker start --wait-for N` for every broker (0: none): nobody serves before N are live.
    wait_for: int = 0
    # Extra `bookie start` arguments for every bookie (e.g. ["--no-autorecovery"]).
    bookie_args: tuple[str, ...] = ()
    # Extra `broker start` arguments for every broker (e.g. ["--leader-balance-s", "2"]).
    broker_args: tuple[str, ...] = ()
    # Keys for every member and an admin key (devtools/dev_keys.py): every socket CURVE, every key checked.
    secure: bool = False
    # Test hosts (devtools/hosts): 0 runs every member on 127.0.0.1; N puts ZooKeeper on a host of
    # its own and bookie i and broker i on host i mod N, each host capped at `cpu_per_host` cores
    # (None: no cap) with `latency_ms` added to what it sends.
    hosts: int = 0
    cpu_per_host: float | None = None
    latency_ms: float = 0.0
    # ZooKeeper servers: 1 (standalone), or an ensemble of 3 or 5 on 127.0.0.1 (devtools.zk_ensemble);
    # None: 1, or what the run directory's record has.
    zk_servers: int | None = None
    # `dev up --api`: an HTTP API process (`fencepost api`) and an admin API key (devtools/dev_api.py).
    api: bool = False

    def validate(self) -> "DevClusterSpec":
        """Check the spec and settle the member counts left to their defaults; returns it."""
        check_cluster_name(self.cluster)
        if not 0 <= self.hosts <= 16:
            raise DevClusterError("--hosts must be between 0 and 16")
        if not self.hosts and (self.cpu_per_host is not None or self.latency_ms):
            raise DevClusterError("--cpu-per-host and --latency-ms need --hosts")
        if not 0 <= self.latency_ms <= 10_000:
            raise DevClusterError("--latency-ms must be between 0 and 10000")
        if self.zk_servers is not None:
            try:
                check_server_count(self.zk_servers)
            except ElectionError as exc:
                raise DevClusterError(f"--zk-servers: {exc}") from None
            if self.hosts and self.zk_servers > 1:
                raise DevClusterError(E_ZK_SERVERS_ON_HOSTS)
        if self.bookies is None:
            self.bookies = self.hosts or DEFAULT_BOOKIES
        if self.brokers is None:
            self.brokers = self.hosts or DEFAULT_BROKERS
        if not 0 <= self.bookies <= 16 or not 0 <= self.brokers <= 16:
            raise DevClusterError("--bookies and --brokers must be between 0 and 16")
        if self.wait_for < 0:
            raise DevClusterError("--wait-for must be >= 0")
        if self.shards is not None and not 1 <= self.shards <= MAX_SHARDS:
            raise DevClusterError(f"--shards must be between 1 and {MAX_SHARDS}")
        if self.brokers and self.ensemble_size is not None and self.ensemble_size > self.bookies:
            raise DevClusterError(
                f"--ensemble-size {self.ensemble_size} needs at least that many bookies, "
                f"not {self.bookies}: no leader could open a ledger"
            )
        return self

    def cluster_options(self) -> dict:
        """The shared options this spec sets (None: not set)."""
        return {name: getattr(self, name) for name in SHARED_OPTIONS}


def with_wait_for(args: list[str], wait_for: int) -> list[str]:
    """A broker's command line with ``--wait-for wait_for`` (replacing one it had)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--wait-for":
            skip = True
        else:
            out.append(arg)
    return [*out, "--wait-for", str(wait_for)]


def read_secret_file(secret_file: str | None) -> bytes | None:
    """The cluster secret in ``secret_file`` (None without one); DevClusterError if it cannot be read."""
    try:
        return read_secret(secret_file) if secret_file else None
    except ElectionError as exc:
        raise DevClusterError(str(exc)) from None


def init_cluster_config(
    zk_hosts: str, spec: DevClusterSpec, secret: bytes | None, secret_file: str | None
) -> str:
    """`cluster init` with the spec's options; an existing config is kept if the spec agrees with it."""
    from election.zk import close, connect

    paths = ClusterPaths(spec.cluster)
    # ZooKeeper has just said "imok" but may still drop the first connections: not worth a warning.
    kazoo_log = logging.getLogger("kazoo")
    level = kazoo_log.level
    kazoo_log.setLevel(logging.ERROR)
    zk = connect(zk_hosts, connect_timeout=15.0)
    kazoo_log.setLevel(level)
    try:
        options = ClusterOptions.with_overrides(spec.cluster_options())
        try:
            check_secret_choice(options.validate(), secret)
            config = init_cluster(zk, paths, options, clock=time.time, secret=secret, shards=spec.shards or 1)
            shards = f", {spec.shards} shards" if (spec.shards or 1) > 1 else ""
            return f"cluster {spec.cluster} initialized (cluster id {config['cluster_id']}{shards})"
        except ClusterAlreadyInitialized:
            config = read_cluster_config(zk, paths) or {}
        except ElectionError as exc:
            if read_cluster_config(zk, paths) is None:
                raise DevClusterError(str(exc)) from None
            config = read_cluster_config(zk, paths) or {}
        # `dev up` again over the same directories: the cluster exists; keep it, if the flags agree.
        differences = option_differences(config, spec.cluster_options())
        if spec.shards is not None and spec.shards != cluster_shards(config):
            differences.append(f"shards: cluster has {cluster_shards(config)}, this member has {spec.shards}")
        if differences:
            raise DevClusterError(
                f"cluster {spec.cluster} exists with other options: " + "; ".join(differences)
            )
        try:
            check_member_secret(config, secret, spec.cluster, source=secret_file or "--secret-file")
        except ElectionError as exc:
            raise DevClusterError(str(exc)) from None
        return f"cluster {spec.cluster} already initialized (cluster id {config['cluster_id']}): keeping its options"
    finally:
        close(zk)
