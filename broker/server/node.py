"""One broker process: identity, store, follower tail, election, and the request loop.

Threads: the main thread runs the request loop (:class:`BrokerServer`); an
election thread stands for leadership and, once elected, runs the takeover
steps of docs/architecture.md, "Takeover" (claim the epoch, recover and close the previous
ledgers, catch up, open our ledger, CAS it onto the log, write
``EpochStarted``, publish ``leader``: :mod:`broker.server.standing.takeover`); a
follower tail applies the log while we do not lead. ZooKeeper state changes
only flip flags: ``SUSPENDED`` stops writes at once, ``LOST`` makes the leader
step down. The live node (:mod:`broker.server.live`), the checkpoints
(:mod:`broker.server.store.checkpoints`) and the bound on stopping
(:mod:`broker.server.stop_budget`) are their own units; this class wires them.

The store is checked before it is trusted (:mod:`broker.server.store.guard`): another
cluster's store, or one beyond the log, stops the broker ("wrong store"); a
store that was not closed in order is verified in full; a damaged one (found
then, by a checkpoint, or by the tail) is never served: it is moved aside and
rebuilt from a snapshot and the ledgers while the broker keeps running.
SIGTERM stops the broker within ``shutdown_timeout_s`` whatever ZooKeeper's state.

Example::

    node = BrokerNode(load_settings(BrokerConfig, "broker", flags))
    sys.exit(node.run())
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import zmq
from kazoo.client import KazooState
from kazoo.exceptions import KazooException

from broker import BrokerError
from broker.server.config import BrokerConfig
from broker.server.live import LivePublisher, advertised_snapshot, claim_live_node
from broker.server.request_loop import BrokerServer, ServerHooks
from broker.server.shutdown_member import ShutdownMember
from broker.server.standing.bookie_wait import BookieWait
from broker.server.standing.candidacy import Candidacy
from broker.server.standing.insync import InSyncTracker
from broker.server.standing.member_wait import MemberWait
from broker.server.standing.takeover import Takeover
from broker.server.standing.takeover_steps import WaitingForBookies
from broker.server.stop_budget import StopBudget
from broker.server.store.checkpoints import Checkpointer, CheckpointHost
from broker.server.store.cluster_start import ClusterStart
from broker.server.store.datalock import DataDirLock
from broker.server.store.follower import Diverged, FollowerTail
from broker.server.store.guard import quarantine
from broker.server.store.keeper import StoreKeeper
from broker.state.crash_check import clear_in_use
from broker.state.store_errors import StoreDamaged
from election import ElectionError
from election.cluster_config import check_member_secret, join_cluster, member_options, read_secret
from election.identity import BrokerIdentity, ensure_broker_id
from election.insync import election_contenders
from election.leader import retract_leader
from election.local.files import write_json_atomically
from election.paths import ClusterPaths
from election.secure.keyring import ServerKeys, reload_on_sighup, set_process_keys
from election.zk import connect, patiently
from ledger import LedgerError
from ledger.client.facade import LedgerClient
from ledger.log import LogGap
from snapshots import SnapshotError
from snapshots.catalog import SnapshotCatalog
from snapshots.policy import CheckpointPolicy
from snapshots.transfer import describe, read_chunk
from snapshots.writer import cleanup_temp

log = logging.getLogger(__name__)

# Share of shutdown_timeout_s a leader may spend handing over; the rest is for local steps.
HANDOVER_SHARE = 0.5


class BrokerNode:
    """A broker process; :meth:`run` blocks until stopped and returns the exit code."""

    def __init__(self, config: BrokerConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config.validate()
        self.clock = clock
        self.paths = ClusterPaths(config.cluster)
        self.stop_event = threading.Event()
        self.exit_code = 0
        self._autorecovery = None  # ledger.replication.auditor.AutoRecovery, in an hmac-sha256 cluster
        self._failing = False
        self._step_down = threading.Event()
        self._tail: FollowerTail | None = None
        self._tail_applied = 0
        self._damaged = threading.Event()
        self._damage_lock = threading.Lock()
        self._handing_over = False
        self.stop_budget = StopBudget(self.stop_event, self.config.shutdown_timeout_s, lambda: self.exit_code)
        self.metrics = None  # broker.server.metrics.BrokerMetrics, with --metrics-listen
        self.server: BrokerServer | None = None
        self.keys: ServerKeys | None = None  # election.secure.keyring.ServerKeys, when secure
        self._metrics_endpoint = None

    # ------------------------------------------------------------ lifecycle
    def run(self) -> int:
        cfg = self.config
        self.data_lock = DataDirLock(Path(cfg.data))
        self.data_lock.acquire()
        self._install_signals()
        self.stop_budget.start()
        self.zk = connect(cfg.zk, session_timeout=cfg.zk_session_timeout_s)
        self._write_session_file()
        try:
            self._start_keys()  # first: a bad key stops us at once; the bookie pool connects with it
            secret = read_secret(cfg.secret_file) if cfg.secret_file else None
            # Before `fencepost cluster init` this waits (or, with init_if_missing, creates `config`).
            cluster = join_cluster(
                self.zk,
                self.paths,
                member_options(cfg),
                cluster=cfg.cluster,
                init_if_missing=cfg.init_if_missing,
                clock=self.clock,
                stop=self.stop_event,
                secret=secret,
            )
            if cluster is None:  # stopped while waiting for the cluster to be initialized
                return self.exit_code
            self.cluster = cluster
            self._cluster_secret = check_member_secret(cluster, secret, cfg.cluster, source=cfg.secret_file)
            data = Path(cfg.data)
            # A cluster without a log may be restarting after ZooKeeper lost its data: the stores decide.
            start = ClusterStart(
                self.zk,
                self.paths,
                data,
                broker_id=lambda: self._claim_identity(data).broker_id,
                wait_for=cfg.wait_for,
                clock=self.clock,
                stop=self.stop_event,
            )
            self.cluster = start.run(self.cluster)
            # Before the identity: a foreign store is refused without registering anything.
            self.keeper = StoreKeeper(
                cfg,
                self.zk,
                self.paths,
                self.cluster["cluster_id"],
                self.clock,
                self.stop_event,
                created_at=self.cluster.get("created_at"),
            )
            store = self.keeper.checked()
            self.identity = self._claim_identity(data)
            log.info("broker %s starting on %s", self.identity, cfg.listen)
            self.catalog = SnapshotCatalog(data / "snapshots")
            cleanup_temp(data / "snapshots")
            self.ledgers = LedgerClient(self.zk, self.paths, secret=self._cluster_secret)
            self._start_autorecovery()
            self.keeper.attach(self.identity.broker_id, self.catalog)
            self.store = self.keeper.verified(store)
            # Who may stand besides the in-sync rules: --wait-for N, and a cluster shutdown under way.
            # A start decided with the members present already waited for them: members that take
            # their state from a snapshot only go live once a leader serves one.
            self.member_wait = MemberWait(
                self.zk,
                self.paths,
                0 if cfg.learner or start.decided else cfg.wait_for,
                changed=self._live_changed,
            )
            self.shutdown_member = ShutdownMember(
                self.zk,
                self.paths,
                data,
                self.identity.broker_id,
                self.identity.name,
                self.keeper.start_status,
            )
            # A takeover needs bookies for its ledger: short of them, stand later rather than burn epochs.
            self.bookie_wait = BookieWait(
                self.zk, self.paths, self.ledgers.options.ensemble_size, changed=self._live_changed
            )
            self._start_metrics()
            self.server = BrokerServer(
                cfg,
                self.store,
                self.identity.broker_id,
                clock=self.clock,
                max_payload=int(self.cluster["max_payload_bytes"]),
                keys=self.keys,
                hooks=ServerHooks(
                    on_leadership_lost=self._leadership_lost,
                    on_cluster_shutdown=self._cluster_shutdown_committed,
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
                ),
            )
            self.server.bind()
            self._start_metrics_endpoint()
            # One live process per broker id: a copy of this data dir must not pose as us.
            claim_live_node(
                self.zk,
                self.paths,
                self.identity.broker_id,
                cfg.listen,
                json.dumps(
                    {"address": cfg.listen, "learner": cfg.learner, "secure": self.keys is not None}
                ).encode(),
                wait_s=cfg.zk_session_timeout_s * 1.5 + 1,
            )
            self.live = LivePublisher(
                self.zk,
                self.paths,
                self.identity.broker_id,
                describe=self._live_info,
                every_s=cfg.live_update_ms / 1000.0,
            )
            self.checkpointer = Checkpointer(self._checkpoint_host())
            self.checkpointer.start()
            self.server.role = "learner" if cfg.learner else "follower"
            self.zk.add_listener(self._on_zk_state)
            self.zk.DataWatch(self.paths.leader, self._on_leader_node)
            self.candidacy = Candidacy(
                self.zk,
                self.paths,
                self.identity.broker_id,
                cfg,
                lead=self._lead_epoch,
                may_lead=lambda: not (self.stop_event.is_set() or self._damaged.is_set()),
                stop=self.stop_event,
                hold=lambda: (
                    self.member_wait.hold() or self.shutdown_member.hold() or self.bookie_wait.hold()
                ),
            )
            self.zk.DataWatch(self.paths.elect, lambda *_: self.candidacy.poke())
            self._start_tail()
            if not cfg.learner:
                threading.Thread(target=self.candidacy.run, name="election", daemon=True).start()
            while not self.stop_event.is_set():
                self.server.serve_once()
                self.live.update()
            self._shutdown()
        finally:
            if self._metrics_endpoint is not None:
                self._metrics_endpoint.close()
            if self.keys is not None:
                self.keys.stop()
            self.stop_budget.close_zk(self.zk)
            self.data_lock.release()
            self.stop_budget.done()
        return self.exit_code

    def _start_keys(self) -> None:
        """A secure broker (key_file, keys_file): the ZAP thread, our key for every connection, SIGHUP reloads."""
        if not self.config.key_file:
            return
        self.keys = ServerKeys(zmq.Context.instance(), self.config.key_file, self.config.keys_file, "broker")
        set_process_keys(self.keys.client_keys())
        reload_on_sighup(self.keys)
        log.info(
            "secure: CURVE with key %s, %d client keys in %s",
            self.keys.pair.name,
            len(self.keys.ring),
            self.config.keys_file,
        )

    def _start_autorecovery(self) -> None:
        """In an hmac-sha256 cluster the bookies cannot verify copies: brokers run AutoRecovery."""
        cfg = self.config
        if not cfg.autorecovery or self._cluster_secret is None:
            return
        from ledger.replication.auditor import AutoRecovery

        self._autorecovery = AutoRecovery(
            self.zk,
            self.paths,
            None,
            self.ledgers.digest,
            f"broker-{self.identity.broker_id}",
            lost_bookie_grace_s=cfg.lost_bookie_grace_s,
            max_bytes_per_s=cfg.rereplication_max_bytes_per_s,
        )
        self._autorecovery.start()
        log.info("AutoRecovery runs in this broker (the cluster signs entries with hmac-sha256)")

    def _start_metrics(self) -> None:
        """With --metrics-listen: the metrics the request loop counts into (its endpoint starts later)."""
        if not self.config.metrics_listen:
            return
        from broker.server.metrics import BrokerMetrics, BrokerSource, leader_lag

        self.metrics = BrokerMetrics(
            BrokerSource(
                broker_id=self.identity.broker_id,
                store=lambda: self.store,
                # Registering the collectors reads them once, before the server exists.
                role=lambda: self.server.role if self.server is not None else "starting",
                counters=lambda: self.server.counters if self.server is not None else {},
                applied_entries=self.applied_entries,
                lag=lambda: 0 if self.leading() else leader_lag(self.zk, self.paths, self.store.position()),
            )
        )

    def _start_metrics_endpoint(self) -> None:
        from election.local.metrics_endpoint import MetricsEndpoint

        if self.metrics is not None:
            self._metrics_endpoint = MetricsEndpoint.start(self.config.metrics_listen, self.metrics.registry)

    def _stop_autorecovery(self) -> None:
        if self._autorecovery is not None:
            self._autorecovery.stop(timeout=self.stop_budget.remaining(5.0))
            self._autorecovery = None

    def _claim_identity(self, data: Path) -> BrokerIdentity:
        return patiently(
            ensure_broker_id,
            self.zk,
            self.paths,
            data,
            self.config.name or data.name,
            self.config.listen,
            clock=self.clock,
            what="claiming the broker id",
        )

    def _rejoin(self) -> None:
        """The tail found its position in a deleted ledger: install a snapshot, then tail again (server thread)."""
        self._stop_tail()
        with self.checkpointer.lock:
            self.store.close()
            try:
                self.store = self.keeper.open(join=True)
            except BrokerError as exc:
                self.fail(exc)
                return
            self.server.store = self.store
            self.checkpointer.latest = self.catalog.latest_valid()
        self._start_tail()

    def store_damaged(self, exc: Exception) -> None:
        """The running store is damaged (any thread): stop writing and leading now, rebuild it once
        leadership has ended."""
        with self._damage_lock:
            if self._damaged.is_set() or self.stop_event.is_set():
                return
            self._damaged.set()
        log.critical("%s; not serving or leading from it any more: moving it aside and rebuilding it", exc)
        self.server.writable = False
        self._step_down.set()
        threading.Thread(target=self._rebuild_when_idle, name="store-rebuild", daemon=True).start()

    def _rebuild_when_idle(self) -> None:
        while (self.candidacy.in_lead or self.server.leadership is not None) and not self.stop_event.is_set():
            time.sleep(0.05)
        if not self.stop_event.is_set():
            self.server.call_soon(self._rebuild_running)

    def _rebuild_running(self) -> None:
        """Swap the damaged store for a rebuilt one (server thread, so no request reads it meanwhile)."""
        self._stop_tail()
        with self.checkpointer.lock:
            self.store.close()
            try:
                aside = quarantine(self.keeper.state_dir, self.clock)
                log.info("damaged state store moved to %s", aside)
                self.store = self.keeper.rebuild()
                self.store.mark_dirty()
            except (BrokerError, SnapshotError, LedgerError, OSError) as exc:
                self.fail(exc)
                return
            self.server.store = self.store
            self.checkpointer.latest = self.catalog.latest_valid()
        self._damaged.clear()
        self.server.writable = self.zk.connected
        self.live.mark_dirty()
        self._start_tail()

    def _on_tail_fatal(self, exc: Exception) -> None:
        if isinstance(exc, LogGap):
            log.warning("%s", exc)
            self.server.call_soon(self._rejoin)
        elif isinstance(exc, StoreDamaged):
            self.store_damaged(exc)
        else:
            # A digest mismatch is local damage if the records no longer hash to our own digest.
            try:
                self.store.verify()
            except StoreDamaged as damage:
                self.store_damaged(damage)
                return
            self.fail(exc)

    # ------------------------------------------------------------ what the checkpointer asks
    def _checkpoint_host(self) -> CheckpointHost:
        cfg = self.config
        return CheckpointHost(
            zk=self.zk,
            paths=self.paths,
            ledgers=self.ledgers,
            catalog=self.catalog,
            cluster_id=self.cluster["cluster_id"],
            broker_id=self.identity.broker_id,
            clock=self.clock,
            policy=CheckpointPolicy(cfg.checkpoint_entries, cfg.checkpoint_s),
            snapshots_kept=cfg.snapshots_kept,
            retention_seconds=cfg.retention_s,
            store=lambda: self.store,
            applied_entries=self.applied_entries,
            leading=self.leading,
            store_damaged=self.store_damaged,
            live_changed=lambda: self.live.mark_dirty(),
            epoch_claim=self._epoch_claim,
        )

    def _epoch_claim(self):
        leadership = self._leadership()
        return leadership.claim if leadership is not None and leadership.ready else None

    def applied_entries(self) -> int:
        return (self.server.applied_entries if self.server is not None else 0) + self._tail_applied

    def _count_tail(self, entries: int) -> None:
        self._tail_applied += entries

    def leading(self) -> bool:
        leadership = self._leadership()
        return leadership is not None and leadership.ready

    def _leadership(self):
        """The server's current leadership, if the server exists yet and leads."""
        return self.server.leadership if self.server is not None else None

    def _install_signals(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
            signal.signal(signal.SIGINT, lambda *_: self.stop())

    def stop(self) -> None:
        """Begin an orderly stop; the process ends within ``shutdown_timeout_s`` whatever happens."""
        self.stop_event.set()
        server = getattr(self, "server", None)
        if server is not None:
            server.wake()

    def fail(self, exc: Exception) -> None:
        """A fatal condition (divergence, a gap in the log): stop loudly with exit code 1.

        A damaged store is not fatal (nor the entry's fault): it is rebuilt instead.
        """
        damage = exc if isinstance(exc, StoreDamaged) else exc.__cause__
        if isinstance(damage, StoreDamaged) and not self._damaged.is_set():
            self.store_damaged(damage)
            return
        with self._damage_lock:
            first, self._failing = not self._failing, True
        if not first:  # the tail and a takeover may both meet the same bad entry: say it once
            log.info("also stopping: %s", exc)
            return
        log.critical("stopping: %s", exc)
        self.exit_code = 1
        self.stop_event.set()
        self.server.wake()

    def _shutdown(self) -> None:
        """Graceful stop: hand leadership over if ZooKeeper lets us, checkpoint, mark the store clean.

        Every wait is bounded by what is left of ``shutdown_timeout_s``; the ZooKeeper steps
        are skipped while it is unreachable (the ledger's fencing stops a stale leader).
        """
        if self.server.leadership is not None:
            self._step_down.set()
            deadline = time.monotonic() + self.stop_budget.remaining(
                self.config.shutdown_timeout_s * HANDOVER_SHARE
            )
            while self.server.leadership is not None and time.monotonic() < deadline:
                self.server.serve_once()
            # The ledger is closed and the leader node retracted after the session ends: let that
            # finish before the ledger client goes (a cluster shutdown's last entry is then final).
            while self.candidacy.in_lead and time.monotonic() < deadline:
                time.sleep(0.01)
        self.candidacy.cancel()
        # A tail blocked in a ZooKeeper call never touches the store again before we exit: do not
        # spend the budget the checkpoint and the clean marker need waiting for it.
        self._stop_tail(timeout=self.stop_budget.remaining(5.0 if self.zk.connected else 1.0))
        clean = not self._damaged.is_set()  # a store awaiting its rebuild stays unclean: verified at start
        try:
            before = self.checkpointer.latest
            if clean and self.checkpointer.checkpoint(publish=self.zk.connected) is before:
                self.store.verify()  # nothing new to snapshot: "clean" still means checked at close
        except StoreDamaged as exc:
            log.critical("%s; not marking it clean, so the next start rebuilds it", exc)
            clean = False
        except (SnapshotError, BrokerError, OSError) as exc:
            log.warning("no checkpoint at shutdown: %s", exc)
        self.checkpointer.stop()
        if clean:
            self.store.mark_clean()
        self.shutdown_member.finish(self.store, sound=clean, connected=self.zk.connected)
        self._stop_autorecovery()
        self.ledgers.close()
        self.server.close()
        self.store.close()
        if self.config.fsync:
            clear_in_use(self.config.data)  # closed and flushed: nothing left for a machine crash to tear

    # ------------------------------------------------------------ ZooKeeper state (never blocks)
    def _on_zk_state(self, state: str) -> None:
        if state == KazooState.SUSPENDED:
            self.server.writable = False
        elif state == KazooState.LOST:
            self.server.writable = False
            self._step_down.set()
            self.live.mark_dirty()
        else:
            self.server.writable = True
            self.live.mark_dirty()
            self._write_session_file()

    def _on_leader_node(self, data, _stat) -> None:
        """Followers learn the leader's address from the `leader` node (for not_leader replies)."""
        try:
            info = json.loads(data) if data else None
        except ValueError:
            info = None
        if self.server.leadership is None:
            self.server.leader_address = info.get("address") if info else None

    def _write_session_file(self) -> None:
        """For fault-injection tests only: expose the ZooKeeper session so a harness can expire it.

        Off unless ``FENCEPOST_ZK_SESSION_FILE`` names a file; written 0600 since the
        password lets its reader act as this session.
        """
        path = os.environ.get("FENCEPOST_ZK_SESSION_FILE")
        if not path:
            return
        session_id, password = self.zk.client_id
        write_json_atomically(path, {"session_id": session_id, "password": password.hex()}, mode=0o600)

    # ------------------------------------------------------------ orderly cluster shutdown
    def _cluster_shutdown_committed(self, shutdown_id: str, position: tuple[int, int]) -> None:
        """Our ClusterShutdown entry is applied (server thread): stop in order, handing leadership to nobody."""
        self.shutdown_member.leader_committed(shutdown_id, position)
        self.stop()

    def _cluster_shutdown_applied(self, shutdown_id: str, position: tuple[int, int]) -> bool:
        """The tail applied a ClusterShutdown (tail thread); True, and an orderly stop, if we are a member."""
        if not self.shutdown_member.follower_applied(shutdown_id, position):
            return False
        self.stop()
        return True

    def _live_changed(self) -> None:
        live = getattr(self, "live", None)
        if live is not None:
            live.mark_dirty()

    def _hand_over(self, target: int) -> None:
        """An admin elect's target is next in line: step down gracefully so that it leads next."""
        self._handing_over = True
        self._step_down.set()

    def _leadership_lost(self, reason: str) -> None:
        log.warning("leadership lost: %s", reason)
        self._step_down.set()

    # ------------------------------------------------------------ follower tail
    def _start_tail(self) -> None:
        self._tail = FollowerTail(
            self.ledgers,
            self.store,
            on_fatal=self._on_tail_fatal,
            on_applied=self._count_tail,
            on_shutdown=self._cluster_shutdown_applied,
            pause_s=self.config.tail_pause_ms / 1000.0,
        )
        self._tail.start()

    def _stop_tail(self, timeout: float = 30.0) -> None:
        # The shutdown and the takeover may both stop the tail: read the attribute once.
        tail = self._tail
        if tail is not None:
            tail.stop()
            tail.join(timeout)
            if not tail.is_alive() and self._tail is tail:
                self._tail = None

    # ------------------------------------------------------------ leadership
    def _lead_epoch(self) -> None:
        self._step_down.clear()
        self._handing_over = False
        self._stop_tail()
        takeover = Takeover(
            self.zk,
            self.paths,
            self.ledgers,
            self.store,
            self.server,
            self.identity.broker_id,
            self.config,
            step_down=self._step_down,
            stopping=self.stop_event,
        )
        try:
            session = takeover.run()
            if self.metrics is not None:
                self.metrics.leaderships.inc()
            self.shutdown_member.served()  # a cluster restarted after a shutdown: that shutdown is over
            self.checkpointer.request("won leadership")
            self.live.mark_dirty()
            tracker = InSyncTracker(
                self.zk,
                self.paths,
                self.config,
                self.identity.broker_id,
                session.epoch,
                position=lambda: self.store.position(),
                contenders=lambda: election_contenders(self.zk, self.paths),
                hand_over=self._hand_over,
                lost=self._leadership_lost,
            )
            tracker.start()
            try:
                while not self._step_down.wait(0.1) and not self.stop_event.is_set():
                    pass
            finally:
                tracker.stop()
        except StoreDamaged as exc:  # our store, not the entry, is at fault: rebuild it
            self.store_damaged(exc)
        except Diverged as exc:  # catching up hit an entry we cannot apply: stop, never skip it
            self.fail(exc)
        except WaitingForBookies as exc:  # nothing claimed: the candidacy's hold says it and waits
            self.bookie_wait.saw(exc.live, exc.reason)
        except (KazooException, ElectionError, LedgerError, BrokerError) as exc:
            log.warning("leadership ended: %s: %s", type(exc).__name__, exc)
        finally:
            if takeover.serving:
                self.candidacy.mark_served()
            # The session's writer is the current one: the session may have rolled since.
            session = takeover.session
            self._end_leadership(session.writer if session is not None else takeover.writer)

    def _end_leadership(self, writer) -> None:
        session = self.server.leadership
        graceful = (
            (self.stop_event.is_set() or self._handing_over)
            and session is not None
            and session.group is not None
            and session.group.failed is None
        )
        if graceful:
            # Answer what is in flight before handing over, so a graceful stop loses no reply.
            self.server.draining = True
            deadline = time.monotonic() + 5
            while not self.server.idle() and time.monotonic() < deadline:
                time.sleep(0.005)
        done = threading.Event()

        def stop_serving() -> None:
            self.server.stop_leading("leadership ended: retry with the new leader")
            done.set()

        self.server.call_soon(stop_serving)
        done.wait(15)
        if writer is not None and graceful:
            try:
                writer.close(timeout=5)
            except LedgerError as exc:
                log.warning("closing ledger %d: %s", writer.ledger_id, exc)
        try:
            retract_leader(self.zk, self.paths)
        except KazooException:
            pass
        self.server.leader_address = None
        self.live.mark_dirty()
        if not self.stop_event.is_set() and not self._damaged.is_set():
            self._start_tail()

    # ------------------------------------------------------------ brokers/live/<id>
    def _bookie_wait_fields(self) -> dict:
        # A leader goes on in its ledger whatever new ledgers would need: only a would-be leader waits.
        return {} if self.server.leadership is not None else self.bookie_wait.live_fields()

    def _live_info(self) -> dict:
        """What our live node advertises (see :mod:`broker.server.live`)."""
        position = self.store.position()
        return {
            "address": self.config.listen,
            "role": self.server.role,
            "learner": self.config.learner,
            "position": list(position) if position else None,
            "epoch": self.store.epoch(),
            "digest": self.store.digest(),
            "name": self.identity.name,
            "updated_at": self.clock(),
            "snapshot": advertised_snapshot(self.checkpointer.latest),
            "secure": self.keys is not None,
            **self.member_wait.live_fields(),
            **self._bookie_wait_fields(),
        }
