"""One broker process: the wiring of its start, its threads and its orderly stop.

Threads: the main thread runs the request loop (:class:`BrokerServer`); an
election thread stands for leadership (:mod:`broker.server.standing.candidacy`) and,
once elected, runs one leadership term (:mod:`broker.server.standing.term`: the
takeover steps of docs/architecture.md, "Takeover", then serving until it steps
down); a follower tail applies the log while we do not lead. ZooKeeper state changes
only flip flags: ``SUSPENDED`` stops writes at once, ``LOST`` makes the leader
step down. The start up to a checked store (:mod:`broker.server.startup`), the store
in service with its tail and repair (:mod:`broker.server.store.running`), the optional
services (:mod:`broker.server.services`), the live node (:mod:`broker.server.live`; what it says and
the ZooKeeper state listener: :mod:`broker.server.node_presence`), leader balancing between shards
(:mod:`broker.server.standing.leader_balance`),
the checkpoints (:mod:`broker.server.store.checkpoints`) and the bound on stopping
(:mod:`broker.server.stop_budget`) are their own units; this class wires them.

The store is checked before it is trusted (:mod:`broker.server.store.guard`): another
cluster's store, or one beyond the log, stops the broker ("wrong store"); a
store that was not closed in order is verified in full; a damaged one (found
then, by a checkpoint, or by the tail) is never served: it is moved aside and
rebuilt from a snapshot and the ledgers while the broker keeps running.
SIGTERM stops the broker within ``shutdown_timeout_s`` whatever ZooKeeper's state.

The node creates the process's one :class:`~election.local.clock.Clock` (or takes the
one it is given) and passes it to every part that times out or schedules.

A node serves one shard (``config.shard``, with its ZooKeeper paths); the node of shard 0 runs
the processes of the other shards (:mod:`broker.server.shard_children`, :mod:`~broker.server.shard_process`).

Example::

    node = BrokerNode(load_settings(BrokerConfig, "broker", flags))
    sys.exit(node.run())
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from pathlib import Path

from broker.server.config import BrokerConfig
from broker.server.live import LivePublisher, claim_live_node
from broker.server.node_presence import LiveInfo, SessionStates, write_session_file
from broker.server.orderly_stop import StopParts, stop_in_order
from broker.server.request_loop import BrokerServer, ServerHooks
from broker.server.services import SideServices
from broker.server.shard_children import ShardChildren, start_shard_children
from broker.server.shard_process import enter_shard_process
from broker.server.shutdown_member import ShutdownMember
from broker.server.standing.bookie_wait import BookieWait
from broker.server.standing.candidacy import Candidacy
from broker.server.standing.leader_balance import start_leader_balance
from broker.server.standing.leader_watch import LeaderWatch
from broker.server.standing.member_wait import MemberWait
from broker.server.standing.term import LeaderTerm, TermHooks
from broker.server.startup import Started, start_member
from broker.server.stop_budget import StopBudget
from broker.server.store.checkpoints import Checkpointer, CheckpointHost
from broker.server.store.datalock import DataDirLock
from broker.server.store.running import RunningHooks, RunningStore
from broker.server.task_settings_view import EffectiveConfig
from broker.state.store import StateStore
from broker.state.store_errors import StoreDamaged
from election.cluster_config import cluster_shards
from election.features import EnabledFeatures, advertised
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from election.task_settings import SETTINGS, ConfigSettingsWatch, configured
from election.zk import connect
from snapshots.policy import CheckpointPolicy
from snapshots.transfer import describe, read_chunk

log = logging.getLogger(__name__)


class BrokerNode:
    """A broker process; :meth:`run` blocks until stopped and returns the exit code."""

    def __init__(self, config: BrokerConfig, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config.validate()
        self.clock = clock
        self.paths = ClusterPaths(config.cluster, shard=config.shard)
        self.stop_event = threading.Event()
        self.exit_code = 0
        self._failing = False
        self._fail_lock = threading.Lock()
        self._step_down = threading.Event()
        self.stop_budget = StopBudget(
            self.stop_event, self.config.shutdown_timeout_s, lambda: self.exit_code, clock=clock
        )
        self.services = SideServices(self.config, clock)
        self.keys = None  # election.secure.keyring.ServerKeys, when secure
        self.metrics = None  # broker.server.metrics.BrokerMetrics, with --metrics-listen
        self.started: Started | None = None
        self.server: BrokerServer | None = None
        self.running: RunningStore | None = None
        self.shard_children: ShardChildren | None = None  # shard 0 of a cluster of several shards

    @property
    def store(self) -> StateStore:
        """The store served from now (another one after a rebuild or a rejoin)."""
        return self.running.store if self.running is not None else self.started.store

    # ------------------------------------------------------------ lifecycle
    def run(self) -> int:
        cfg = self.config
        if cfg.shard and not enter_shard_process(cfg.shard):
            return 1
        self.data_lock = DataDirLock(Path(cfg.data))
        self.data_lock.acquire()
        self._install_signals()
        self.stop_budget.start()
        self.zk = connect(cfg.zk, session_timeout=cfg.zk_session_timeout_s)
        write_session_file(self.zk)
        try:
            # The keys first: a bad key stops us at once; the bookie pool connects with them.
            self.keys = self.services.start_keys()
            self.started = start_member(
                cfg, self.zk, self.paths, self.services, self.stop_event, self.clock, self._start_shards
            )
            if self.started is not None:  # None: stopped while waiting for the cluster to be initialized
                self._serve(self.started)
        finally:
            if self.shard_children is not None:
                self.shard_children.close(timeout=self.stop_budget.remaining(cfg.shutdown_timeout_s))
            self.services.close()
            self.stop_budget.close_zk(self.zk)
            self.data_lock.release()
            self.stop_budget.done()
        return self.exit_code

    def _start_shards(self, cluster: dict) -> None:
        """Once our id is claimed: the processes of the cluster's other shards (if we serve shard 0)."""
        self.shard_children = self.shard_children or start_shard_children(
            self.config, cluster, self.stop_event, self.stop_budget.remaining, self.clock
        )

    def _config_changed(self) -> None:
        """The ``config`` node changed (kazoo's thread): a leader logs new task settings at its next turn."""
        if self.server is not None:
            self.server.housekeeping.config_changed()

    @staticmethod
    def _log_task_settings(cluster: dict, task_cfg: EffectiveConfig) -> None:
        missing = [name for name in SETTINGS if name not in configured(cluster)]
        if missing:
            log.warning(
                "the cluster's config holds no value for the task settings %s (a cluster initialised "
                "before version 0.3.0): this broker acts on its own options for them until "
                "`fencepost cluster config set` gives one",
                ", ".join(missing),
            )
        log.info(
            "task settings: %s",
            ", ".join(f"{name}={value}" for name, value in task_cfg.task_settings().items()),
        )

    def _serve(self, started: Started) -> None:
        """Wire the parts around the started store, serve until stopped, stop in order."""
        cfg, clock = self.config, self.clock
        self.identity, self.ledgers, self.catalog = started.identity, started.ledgers, started.catalog
        # Who may stand besides the in-sync rules: --wait-for N, and a cluster shutdown under way.
        # A start decided with the members present already waited for them: members that take
        # their state from a snapshot only go live once a leader serves one.
        self.member_wait = MemberWait(
            self.zk,
            self.paths,
            0 if cfg.learner or started.decided else cfg.wait_for,
            changed=self._live_changed,
        )
        self.shutdown_member = ShutdownMember(
            self.zk,
            self.paths,
            Path(cfg.data),
            self.identity.broker_id,
            self.identity.name,
            started.keeper.start_status,
            stop=self.stop,
            clock=clock,
        )
        # A takeover needs bookies for its ledger: short of them, stand later rather than burn epochs.
        self.bookie_wait = BookieWait(
            self.zk, self.paths, self.ledgers.options.ensemble_size, changed=self._live_changed, clock=clock
        )
        self.metrics = self.services.start_metrics(self._metrics_source)
        # How tasks behave is the cluster's (election/task_settings.py), whatever this broker's options say.
        task_cfg = EffectiveConfig(
            cfg,
            store=lambda: self.server.store if self.server is not None else started.store,
            configured=ConfigSettingsWatch(self.zk, self.paths, changed=self._config_changed).settings,
        )
        self._log_task_settings(started.cluster, task_cfg)
        self.server = BrokerServer(
            task_cfg,
            started.store,
            self.identity.broker_id,
            clock=clock,
            max_payload=int(started.cluster["max_payload_bytes"]),
            keys=self.keys,
            hooks=ServerHooks(
                on_leadership_lost=lambda reason: self.term.lost(reason),
                on_cluster_shutdown=self.shutdown_member.leader_committed,
                not_leader_note=lambda: (
                    self.member_wait.reason()
                    or (self.bookie_wait.reason() if self.server.leader_address is None else "")
                ),
                on_fatal=self.fail,
                describe_snapshot=lambda: describe(self.catalog),
                read_snapshot_chunk=lambda name, offset, length: read_chunk(
                    self.catalog, name, offset, length
                ),
                metrics=self.metrics,
                feature_enabled=EnabledFeatures(self.zk, self.paths).enabled,
            ),
        )
        self.server.bind()
        self.services.start_metrics_endpoint()
        # One live process per broker id: a copy of this data dir must not pose as us. The node says
        # our version and flags from the start: `cluster enable-feature` reads them as soon as it exists.
        claim_live_node(
            self.zk,
            self.paths,
            self.identity.broker_id,
            cfg.listen,
            json.dumps(
                {
                    "address": cfg.listen,
                    "learner": cfg.learner,
                    "secure": self.keys is not None,
                    **advertised(),
                }
            ).encode(),
            wait_s=cfg.zk_session_timeout_s * 1.5 + 1,
            clock=clock,
        )
        info = LiveInfo(
            cfg,
            self.server,
            lambda: self.store,
            self.identity.name,
            self.member_wait,
            self.bookie_wait,
            latest_snapshot=lambda: self.checkpointer.latest,
            secure=self.keys is not None,
            clock=clock,
        )
        self.live = LivePublisher(
            self.zk,
            self.paths,
            self.identity.broker_id,
            # ... and whether the store passed its check since the start (store_check).
            describe=lambda: {**info(), **self.running.verification.live_fields()},
            every_s=cfg.live_update_ms / 1000.0,
            clock=clock,
        )
        self.checkpointer = Checkpointer(self._checkpoint_host(started))
        self.running = RunningStore(
            started.store,
            started.keeper,
            self.catalog,
            self.ledgers,
            self.server,
            self.checkpointer,
            cfg,
            self.stop_event,
            self._step_down,
            hooks=RunningHooks(
                fail=self.fail,
                leading=lambda: self.candidacy.in_lead,
                shutdown_applied=self.shutdown_member.follower_applied,
                live_changed=self.live.mark_dirty,
                connected=lambda: self.zk.connected,
            ),
            clock=clock,
            verified=lambda: (self.candidacy.poke(), self.live.mark_dirty()),  # stand now, and say so
        )
        self.checkpointer.start()
        self.server.role = "learner" if cfg.learner else "follower"
        self.zk.add_listener(SessionStates(self.zk, self.server, self._step_down, self.live.mark_dirty))
        self.zk.DataWatch(self.paths.leader, lambda data, _stat: self.server.leader_node_changed(data))
        self.term = LeaderTerm(
            self.zk,
            self.paths,
            self.ledgers,
            self.server,
            self.running,
            task_cfg,
            self.identity.broker_id,
            self.stop_event,
            self._step_down,
            hooks=TermHooks(
                won=self._won_leadership,
                bookies_short=self.bookie_wait.saw,
                live_changed=self.live.mark_dirty,
                fail=self.fail,
            ),
            clock=clock,
        )
        self.candidacy = Candidacy(
            self.zk,
            self.paths,
            self.identity.broker_id,
            task_cfg,
            lead=self.term.lead,
            may_lead=lambda: not (self.stop_event.is_set() or self.running.is_damaged),
            stop=self.stop_event,
            # Never stand on a store not checked since it was opened (start_verify).
            hold=lambda: (
                self.running.verification.hold()
                or self.member_wait.hold()
                or self.shutdown_member.hold()
                or self.bookie_wait.hold()
            ),
            clock=clock,
        )
        self.zk.DataWatch(self.paths.elect, lambda *_: self.candidacy.poke())
        self.running.verify_started(started.keeper.verified_report)
        self.running.start_tail()
        if not cfg.learner:
            threading.Thread(target=self.candidacy.run, name="election", daemon=True).start()
            # Heartbeats to the leader: a dead one is replaced without waiting for its session to expire.
            LeaderWatch(
                self.zk,
                self.paths,
                self.identity.broker_id,
                cfg,
                position=self.running.position,  # None while a rebuild or a rejoin swaps the store
                may_act=self.candidacy.may_stand_without,
                cleared=self.candidacy.replaced,
                stop=self.stop_event,
                clock=clock,
            ).start()
        start_leader_balance(
            cfg,
            cluster_shards(started.cluster),
            self.zk,
            self.paths,
            self.identity.broker_id,
            leading=self._balance_epoch,
            stop=self.stop_event,
            clock=clock,
        )
        while not self.stop_event.is_set():
            self.server.serve_once()
            self.live.update()
        self.running.verification.close()
        parts = StopParts(
            self.server,
            self.candidacy,
            self.running,
            self.checkpointer,
            self.shutdown_member,
            self.services,
            self.ledgers,
            self.zk,
        )
        stop_in_order(parts, self._step_down, self.stop_budget, cfg, clock)

    def _metrics_source(self):
        """What the metrics read when Prometheus scrapes (with --metrics-listen)."""
        from broker.server.metrics import BrokerSource, leader_lag

        return BrokerSource(
            broker_id=self.identity.broker_id,
            # A 1-shard cluster's metrics keep no shard label.
            shard=self.config.shard if cluster_shards(self.started.cluster) > 1 else None,
            store=lambda: self.store,
            # Registering the collectors reads them once, before the server exists.
            role=lambda: self.server.role if self.server is not None else "starting",
            counters=lambda: self.server.counters if self.server is not None else {},
            applied_entries=self.applied_entries,
            lag=lambda: 0 if self._leading() else leader_lag(self.zk, self.paths, self.store.position()),
        )

    # ------------------------------------------------------------ what the checkpointer asks
    def _checkpoint_host(self, started: Started) -> CheckpointHost:
        cfg = self.config
        return CheckpointHost(
            zk=self.zk,
            paths=self.paths,
            ledgers=self.ledgers,
            catalog=self.catalog,
            cluster_id=started.cluster["cluster_id"],
            broker_id=self.identity.broker_id,
            clock=self.clock,
            policy=CheckpointPolicy(cfg.checkpoint_entries, cfg.checkpoint_s),
            snapshots_kept=cfg.snapshots_kept,
            retention_seconds=cfg.retention_s,
            store=lambda: self.store,
            applied_entries=self.applied_entries,
            leading=self._leading,
            store_damaged=lambda exc: self.running.damaged(exc),
            live_changed=lambda: self.live.mark_dirty(),
            epoch_claim=lambda: self.server.epoch_claim(),
        )

    def applied_entries(self) -> int:
        tail = self.running.tail_applied if self.running is not None else 0
        return (self.server.applied_entries if self.server is not None else 0) + tail

    def _leading(self) -> bool:
        return self.server is not None and self.server.leading()

    # ------------------------------------------------------------ stopping
    def _install_signals(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
            signal.signal(signal.SIGINT, lambda *_: self.stop())

    def stop(self) -> None:
        """Begin an orderly stop; the process ends within ``shutdown_timeout_s`` whatever happens."""
        self.stop_event.set()
        server = self.server
        if server is not None:
            server.wake()

    def fail(self, exc: Exception) -> None:
        """A fatal condition (divergence, a gap in the log): stop loudly with exit code 1.

        A damaged store is not fatal (nor the entry's fault): it is rebuilt instead.
        """
        damage = exc if isinstance(exc, StoreDamaged) else exc.__cause__
        if isinstance(damage, StoreDamaged) and self.running is not None and not self.running.is_damaged:
            self.running.damaged(damage)
            return
        with self._fail_lock:
            first, self._failing = not self._failing, True
        if not first:  # the tail and a takeover may both meet the same bad entry: say it once
            log.info("also stopping: %s", exc)
            return
        log.critical("stopping: %s", exc)
        self.exit_code = 1
        self.stop_event.set()
        self.server.wake()

    # ------------------------------------------------------------ leading
    def _balance_epoch(self) -> int | None:
        """The epoch we serve as leader in, for leader balancing; None when we do not lead, or when a
        cluster shutdown is under way (its last entry must be written by the leader that began it)."""
        leadership = self.server.leadership if self.server is not None else None
        if leadership is None or not leadership.ready or leadership.shutdown is not None:
            return None
        return leadership.epoch

    def _won_leadership(self) -> None:
        """A takeover serves (election thread)."""
        if self.metrics is not None:
            self.metrics.leaderships.inc()
        self.shutdown_member.served()  # a cluster restarted after a shutdown: that shutdown is over
        self.checkpointer.request("won leadership")
        self.live.mark_dirty()

    def _live_changed(self) -> None:
        live = getattr(self, "live", None)
        if live is not None:
            live.mark_dirty()
