"""A broker's start: from a ZooKeeper session to a checked store and the identity it serves under.

In order (each wait gives up when the stop event is set):

1. join the cluster: before ``fencepost cluster init`` this waits (or, with
   ``init_if_missing``, creates the cluster's ``config``); the member secret must match it,
   and the broker must support every feature flag the cluster enabled;
2. a cluster without a log may be restarting after ZooKeeper lost its data: the members'
   stores decide how it starts (:mod:`broker.server.store.cluster_start`);
3. the store is checked before the identity is claimed: another cluster's store, or one
   beyond the log, is refused ("wrong store") without registering anything
   (:class:`broker.server.store.keeper.StoreKeeper`);
4. the broker id is claimed (``brokers/ids``; the process of a shard n > 0 reads its broker's
   id instead, :mod:`broker.server.shard_process`), the caller told (the broker of shard 0
   then starts its other shards' processes), the snapshot catalog opened (temporary files of
   an interrupted snapshot removed), the ledger client created, and AutoRecovery started where
   the cluster needs it (:mod:`broker.server.services`; by the broker of shard 0 only);
5. a store that was not closed in order is verified, a damaged one rebuilt, and one the
   log alone cannot bring up to date gets a snapshot; it is then marked in use.

Example::

    started = start_member(config, zk, paths, services, stop_event, clock)
    if started is None:      # stopped while waiting for `fencepost cluster init`
        return
    serve(started.store, started.identity, started.ledgers)
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kazoo.client import KazooClient

from broker.server.config import BrokerConfig, BrokerConfigError
from broker.server.services import SideServices
from broker.server.shard_process import wait_for_identity
from broker.server.store.cluster_start import ClusterStart
from broker.server.store.keeper import StoreKeeper
from broker.state.store import StateStore
from election.cluster_config import (
    check_member_secret,
    cluster_shards,
    join_cluster,
    member_options,
    read_secret,
)
from election.features import check_supported
from election.identity import BrokerIdentity, ensure_broker_id
from election.local.clock import Clock
from election.paths import ClusterPaths
from election.task_settings import CONFIG_KEY as TASK_SETTINGS_KEY
from election.task_settings import add_missing
from election.task_settings import defaults as task_defaults
from election.zk import patiently
from ledger.client.facade import LedgerClient
from snapshots.catalog import SnapshotCatalog
from snapshots.writer import cleanup_temp

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Started:
    """What a broker serves with once started."""

    cluster: dict  # the cluster's config document
    cluster_secret: bytes | None  # set in a cluster that signs entries with hmac-sha256
    # The start was decided with the members present (a cluster without a log): they waited already.
    decided: bool
    keeper: StoreKeeper
    identity: BrokerIdentity
    catalog: SnapshotCatalog
    ledgers: LedgerClient
    store: StateStore  # checked, verified or rebuilt, marked in use


def start_member(
    config: BrokerConfig,
    zk: KazooClient,
    paths: ClusterPaths,
    services: SideServices,
    stop: threading.Event,
    clock: Clock,
    identity_claimed: Callable[[dict], None] = lambda cluster: None,
) -> Started | None:
    """The steps of the module docstring; None when stopped while waiting for the cluster's init.

    ``identity_claimed(cluster config)`` is called once the broker id is ours.
    """
    secret = read_secret(config.secret_file) if config.secret_file else None
    cluster = join_cluster(
        zk,
        paths,
        member_options(config),
        cluster=config.cluster,
        init_if_missing=config.init_if_missing,
        clock=clock.now,
        stop=stop,
        secret=secret,
        task_settings=task_defaults(config),  # a config this broker creates takes its options
    )
    if cluster is None:
        return None
    settings = patiently(
        add_missing, zk, paths, task_defaults(config), what="completing the cluster's task settings"
    )
    cluster = {**cluster, TASK_SETTINGS_KEY: settings}
    cluster_secret = check_member_secret(cluster, secret, config.cluster, source=config.secret_file)
    patiently(check_supported, zk, paths, "broker", what="reading the cluster's feature flags")
    if config.shard >= cluster_shards(cluster):
        raise BrokerConfigError(
            f"cluster {config.cluster} has {cluster_shards(cluster)} shard(s): there is no shard {config.shard}"
        )
    data = Path(config.data)
    start = ClusterStart(
        zk,
        paths,
        data,
        broker_id=lambda: claim_identity(config, zk, paths, clock, stop).broker_id,
        wait_for=config.wait_for,
        clock=clock,
        stop=stop,
    )
    cluster = start.run(cluster)
    keeper = StoreKeeper(
        config, zk, paths, cluster["cluster_id"], clock, stop, created_at=cluster.get("created_at")
    )
    store = keeper.checked()
    identity = claim_identity(config, zk, paths, clock, stop)
    log.info("broker %s starting on %s", identity, config.listen)
    identity_claimed(cluster)
    catalog = SnapshotCatalog(data / "snapshots")
    cleanup_temp(data / "snapshots")
    ledgers = LedgerClient(zk, paths, secret=cluster_secret, clock=clock)
    if config.shard == 0:  # one AutoRecovery per broker, whatever the shards
        services.start_autorecovery(zk, paths, ledgers.digest, identity.broker_id, cluster_secret)
    keeper.attach(identity.broker_id, catalog)
    return Started(
        cluster=cluster,
        cluster_secret=cluster_secret,
        decided=start.decided,
        keeper=keeper,
        identity=identity,
        catalog=catalog,
        ledgers=ledgers,
        store=keeper.verified(store),
    )


def claim_identity(
    config: BrokerConfig, zk: KazooClient, paths: ClusterPaths, clock: Clock, stop: threading.Event
) -> BrokerIdentity:
    """This data directory's broker id (registered under ``brokers/ids`` on the first start); the
    process of a shard n > 0 takes its broker's, never registering one."""
    data = Path(config.data)
    if config.shard:
        return wait_for_identity(data, config.shard, config.cluster, stop, clock)
    return patiently(
        ensure_broker_id,
        zk,
        paths,
        data,
        config.name or data.name,
        config.listen,
        clock=clock.now,
        what="claiming the broker id",
    )
