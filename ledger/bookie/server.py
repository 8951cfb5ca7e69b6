"""The bookie server: stores ledger entries for writers and serves them to readers.

One thread owns the serving kernel (:class:`election.wire.kernel.ServingKernel`: the
ROUTER socket, decoding, role check, the one send site) and the LMDB store. The
bookie's operations are the kernel's op table (:mod:`ledger.bookie.ops`). Each turn
of the poll loop drains every waiting frame (up to ``max_batch``), answers reads at
once, gathers all adds into ONE store transaction (not synced) and ONE journal group
(one fdatasync) and only then acks them (:mod:`ledger.bookie.group_commit`); a
checkpoint thread syncs the store now and then and drops the journal before it
(:mod:`ledger.bookie.checkpoint`), and a start replays the journal from the last
checkpoint (:mod:`ledger.bookie.journal_replay`). Frames are never trusted: anything that does not decode, is too large, has the wrong protocol
version, names an unknown operation or carries bad fields gets an error reply and
is counted; the loop never dies on input.

Long polls (``wait_lac``) are parked per ledger and answered as soon as an add
batch (or a fence) moves that ledger, or at their deadline; the poll timeout is
bounded by the nearest deadline so they are answered on time.

ZooKeeper holds only the bookie's ephemeral registration (``bookies/<id>``:
address, free space). A keeper thread re-registers after a session loss and
refreshes the free space, so no ZooKeeper call ever blocks the serving loop.

A secure bookie (``key_file`` and ``keys_file``) serves on a CURVE socket whose
ZAP thread admits known keys only; the kernel reads each request's role from its
frame's User-Id, and an op outside that role's rights (:mod:`election.secure.roles`) is
answered ``forbidden`` and counted. A plain bookie reads and checks nothing of the kind.

The request protocol (operations, fields, error codes) is described and
checked in :mod:`ledger.bookie.protocol`; the envelope is ``election.wire``.
"""

from __future__ import annotations

import logging
import signal
import threading

import zmq
from kazoo.client import KazooClient

from election import zk as zkutil
from election.cluster_config import join_cluster, member_options
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from election.secure.keyring import ServerKeys, reload_on_sighup, set_process_keys
from election.wire.dispatch import KernelHooks
from election.wire.kernel import ServingKernel
from ledger import LedgerError
from ledger.bookie import crash_points
from ledger.bookie.checkpoint import Checkpointer
from ledger.bookie.config import BookieConfig
from ledger.bookie.cookie import bind_instance, cookie_for_cluster
from ledger.bookie.gc import GarbageCollector, Handoff
from ledger.bookie.group_commit import GroupCommit
from ledger.bookie.integrity import open_vouched_store, prepare_store
from ledger.bookie.journal import Journal
from ledger.bookie.journal_replay import open_journal
from ledger.bookie.ops import BookieOps
from ledger.bookie.polls import LongPolls
from ledger.bookie.registration import BookieRegistration
from ledger.bookie.store import BookieStore, ReadOnlyGate

log = logging.getLogger(__name__)

POLL_MS = 100
# A read-only bookie that saw no add for this long probes the disk with a commit of its own: new
# ledgers leave it out, so without the probe it would never learn that space came back.
IDLE_PROBE_S = 3.0
# ZMQ_MAXMSGSIZE: a frame somewhat over max_frame_bytes still gets an "oversized" reply; a far
# larger one makes ZeroMQ drop the peer before the frame can take the memory.
RECEIVE_FACTOR, MIN_RECEIVE_LIMIT = 4, 64 * 1024 * 1024


class Bookie(BookieOps, GroupCommit):
    """One bookie: a store, a ROUTER socket and a ZooKeeper registration.

    This module holds its lifecycle and poll loop; the op table is :class:`BookieOps`,
    the group commit and read-only mode :class:`GroupCommit`.

    Usage (``run_bookie(config)`` does this, plus SIGTERM/SIGINT handling)::

        config = BookieConfig(data="/var/lib/bookie", listen="tcp://10.0.0.5:3181", zk="zk1:2181")
        bookie = Bookie(config)
        bookie.start()
        try:
            bookie.serve(stop_event)
        finally:
            bookie.close()
    """

    def __init__(self, config: BookieConfig, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config.validate()
        self._clock = clock  # handed to every part that times out or schedules
        self.bookie_id: str | None = None
        self.cluster_id: str | None = None
        self.counters = {
            "adds": 0,
            "reads": 0,
            "bad_requests": 0,
            "batches": 0,
            "readonly_refusals": 0,
            "unknown_replies": 0,
            "forbidden": 0,
            "journal_syncs": 0,
            "journal_groups": 0,
            "journal_records": 0,
            "journal_bytes": 0,
            "checkpoints": 0,
            "replayed_records": 0,
        }
        self.verified_at_start = False
        self._limbo: dict[int, dict] = {}
        # This turn's checked adds, stored by _commit in one transaction (see _commit for an item).
        self._adds: list[tuple] = []
        self._gate = ReadOnlyGate()
        self._adds_seen_at = 0.0  # monotonic time of the last turn with adds
        self._vouching = False  # the clean-shutdown marker is cleared: close() must set it again
        self._started = clock.monotonic()
        self._zk: KazooClient | None = None
        self._store: BookieStore | None = None
        self._journal: Journal | None = None
        self._checkpoints: Checkpointer | None = None
        self._ctx: zmq.Context | None = None
        self._registration: BookieRegistration | None = None
        self._autorecovery = None  # ledger.replication.auditor.AutoRecovery, when the config runs it
        self._kernel = ServingKernel(
            "bookie",
            self._op_table(),
            self.config.max_frame_bytes,
            hooks=KernelHooks(failure_reply=self._failure_reply),
            counters=self.counters,
            receive_limit=max(RECEIVE_FACTOR * self.config.max_frame_bytes, MIN_RECEIVE_LIMIT),
            clock=clock,
        )
        self._polls = LongPolls(self._info, self._kernel.send, entries=self._entries_after)
        self._explicit_lac: dict[int, int] = {}
        self._handoff = Handoff(clock)  # store calls of the garbage collector's thread, run by the loop
        self._gc: GarbageCollector | None = None
        self.metrics = None  # ledger.bookie.metrics.BookieMetrics, with --metrics-listen
        self._metrics_endpoint = None
        self._turn_started = 0.0  # the clock's monotonic at the start of the current poll turn
        self.keys: ServerKeys | None = None  # election.secure.keyring.ServerKeys, when secure

    def start(self, stop: threading.Event | None = None) -> bool:
        """Join the cluster: read its config, check the cookie, open the store, bind, register.

        Before `fencepost cluster init` it waits for the cluster's config (or creates it with
        ``init_if_missing``); False if ``stop`` was set meanwhile (nothing to serve or close).
        Options that differ from the cluster's raise ConfigMismatch, naming each.
        """
        cfg = self.config
        crash_points.arm()  # tests only: unset, nothing is armed and the write path is untouched
        try:
            self._zk = zkutil.connect(cfg.zk, session_timeout=cfg.zk_session_timeout_s)
            paths = ClusterPaths(cfg.cluster)
            stop = stop or threading.Event()
            cluster = join_cluster(
                self._zk,
                paths,
                member_options(cfg),
                cluster=cfg.cluster,
                init_if_missing=cfg.init_if_missing,
                clock=self._clock.now,
                stop=stop,
            )
            if cluster is None:
                self.close()
                return False
            cookie, cluster = cookie_for_cluster(
                self._zk,
                paths,
                cfg.data,
                cluster,
                cfg.bookie_id,
                cfg.default_bookie_id(),
                stop=stop,
                clock=self._clock,
            )
            self.cluster_id = cluster["cluster_id"]
            self._store, cookie = open_vouched_store(cfg, cookie)
            self._journal, replayed = open_journal(
                cfg, cookie["bookie_id"], cookie["instance_id"], self._store
            )
            self.counters["replayed_records"] = replayed.records
            if replayed.disk_full:
                self._gate.failed(self._clock.monotonic())  # published with the registration below
            self._checkpoints = Checkpointer(
                self._store,
                cfg.journal_path(),
                cookie["instance_id"],
                cookie["bookie_id"],
                cfg.journal_checkpoint_s,
                self._journal.position(),
                self._clock.monotonic(),
            )
            cookie = zkutil.patiently(
                bind_instance, self._zk, paths, cfg.data, cookie, clock=self._clock, what="binding the cookie"
            )
            self.bookie_id = cookie["bookie_id"]
            self.verified_at_start = not self._store.was_clean()
            self._limbo = prepare_store(cfg, self.bookie_id, self._store, self._clock)
            self._vouching = True
            self._checkpoints.start()
            self._gc = GarbageCollector(
                self._zk,
                paths,
                self.bookie_id,
                self._local_ledgers,
                self._forget_ledger,
                self._handoff,
                cfg.gc_interval_s,
                clock=self._clock,
            )
            self._gc.collect_once(inline=True)  # before binding: never serve a ledger this bookie lost
            self._ctx = zmq.Context()
            if cfg.key_file:
                self._secure()
            try:
                self._kernel.bind(self._ctx, cfg.listen, self.keys)
            except zmq.ZMQError as exc:
                raise LedgerError(f"cannot listen on {cfg.listen}: {exc}") from None
            self._registration = BookieRegistration(
                self._zk,
                paths,
                self.bookie_id,
                cfg.listen,
                cfg.data,
                secure=self.keys is not None,
                clock=self._clock,
            )
            self._registration.set_readonly(self._gate.readonly)
            zkutil.patiently(
                self._registration.register,
                wait_s=1.5 * cfg.zk_session_timeout_s + 1,
                what="registering the bookie",
            )
            self._registration.start_keeper()
            self._gc.start()
            self._start_metrics()
            if cfg.autorecovery:
                self._start_autorecovery(paths)
        except BaseException:
            self.close()
            raise
        self._started = self._clock.monotonic()
        log.info(
            "bookie %s serving %s for cluster %s (%s), data in %s",
            self.bookie_id,
            cfg.listen,
            cfg.cluster,
            self.cluster_id,
            cfg.data,
        )
        return True

    def _secure(self) -> None:
        """Keys for CURVE on the ROUTER (checked by the ZAP thread); our key for re-replication; SIGHUP reloads."""
        cfg = self.config
        self.keys = ServerKeys(self._ctx, cfg.key_file, cfg.keys_file, "bookie")
        set_process_keys(self.keys.client_keys())
        reload_on_sighup(self.keys)

    def _start_autorecovery(self, paths: ClusterPaths) -> None:
        """Run the auditor election and a re-replication worker in this process (``autorecovery``)."""
        from election.cluster_config import read_cluster_config
        from ledger.codec import Digest
        from ledger.replication.auditor import AutoRecovery

        cfg = self.config
        digest_name = str((read_cluster_config(self._zk, paths) or {}).get("digest", "crc32c"))
        if digest_name != "crc32c":
            # A bookie holds no secret: it cannot verify the copies it would re-replicate.
            log.warning(
                "autorecovery is off in bookie %s: the cluster's %s digest needs the secret to verify copies",
                self.bookie_id,
                digest_name,
            )
            return
        self._autorecovery = AutoRecovery(
            self._zk,
            paths,
            None,
            Digest.crc32c(),
            self.bookie_id,
            lost_bookie_grace_s=cfg.lost_bookie_grace_s,
            max_bytes_per_s=cfg.rereplication_max_bytes_per_s,
            clock=self._clock,
        )
        self._autorecovery.start()

    def _start_metrics(self) -> None:
        """With --metrics-listen: the Prometheus endpoint (ledger.bookie.metrics)."""
        if not self.config.metrics_listen:
            return
        from election.local.metrics_endpoint import MetricsEndpoint
        from ledger.bookie.metrics import BookieMetrics, BookieSource

        self.metrics = BookieMetrics(
            BookieSource(
                bookie_id=lambda: self.bookie_id,
                store=lambda: self._store,
                counters=lambda: self.counters,
                readonly=lambda: self._gate.readonly,
                limbo_ledgers=lambda: len(self._limbo),
            ),
            clock=self._clock,
        )
        self._metrics_endpoint = MetricsEndpoint.start(self.config.metrics_listen, self.metrics.registry)

    def close(self) -> None:
        """Release everything; safe to call twice and after a failed start."""
        if self._metrics_endpoint is not None:  # first: a scrape must not read a closing store
            self._metrics_endpoint.close()
            self._metrics_endpoint = None
        self._handoff.close()  # the loop no longer runs: a waiting collector must not wait for it
        if self._gc is not None:
            self._gc.stop()
            self._gc = None
        if self._autorecovery is not None:
            self._autorecovery.stop()
            self._autorecovery = None
        if self._registration is not None:
            self._registration.stop()
        self._kernel.close()
        if self.keys is not None:  # its ZAP socket must close before the context terminates
            self.keys.stop()
            self.keys = None
        if self._ctx is not None:
            self._ctx.term()
        if self._checkpoints is not None:  # the loop is done: a last checkpoint covers the whole journal
            self._checkpoints.close(self._journal.position() if self._vouching else None)
            self._checkpoints = None
        if self._journal is not None:
            self._journal.close()
        if self._store is not None:
            if self._vouching:
                try:
                    self._store.mark_clean()
                except Exception as exc:  # a full disk: the next start verifies, which is only slower
                    log.warning("could not record the clean shutdown of bookie %s: %s", self.bookie_id, exc)
            self._store.close()
        if self._zk is not None:
            try:
                zkutil.close(self._zk)
            except Exception:  # a dead session must not hide the error that got us here
                log.debug("closing the ZooKeeper client failed", exc_info=True)
        self._registration = self._ctx = self._store = self._zk = self._journal = None

    def serve(self, stop: threading.Event) -> None:
        """Run the poll loop until ``stop`` is set."""
        kernel, monotonic = self._kernel, self._clock.monotonic
        while not stop.is_set():
            if kernel.poll(self._polls.timeout_ms(monotonic(), POLL_MS)):
                self._turn_started = monotonic()
                kernel.serve_turn(self.config.max_batch)  # the handlers gather the adds...
                self._commit()  # ...acked once stored
            if self._handoff:
                self._handoff.run_pending()
            now = monotonic()
            self._polls.expire(now)
            self._checkpoints.offer(self._journal.position(), now)  # idle too: replay stays short
            if self._gate.readonly and now - self._adds_seen_at >= IDLE_PROBE_S and self._gate.may_try(now):
                self._probe_disk(now)
            if self._registration is not None and self._registration.fatal:
                raise LedgerError(self._registration.fatal)


def run_bookie(config: BookieConfig, stop: threading.Event | None = None) -> None:
    """Run a bookie until ``stop`` is set or, when called in the main thread, SIGTERM/SIGINT.

    Raises LedgerError (e.g. :class:`ledger.bookie.cookie.WrongClusterError`) or
    ElectionError when the bookie cannot start; the CLI prints it and exits 1.
    """
    stop = stop or threading.Event()
    bookie = Bookie(config)
    previous = []
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous.append((sig, signal.signal(sig, lambda signum, frame: stop.set())))
    try:
        if bookie.start(stop):
            bookie.serve(stop)
            log.info("bookie %s stopping", bookie.bookie_id)
    finally:
        bookie.close()
        for sig, handler in previous:
            signal.signal(sig, handler)
