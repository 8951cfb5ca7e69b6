"""AutoRecovery: the auditor that marks closed ledgers of lost bookies, and the re-replication worker.

Every bookie process may run AutoRecovery (``autorecovery``, on by default).
Each round:

* **auditor** (one process at a time: whoever holds the kazoo lock at
  ``auditor``): notes when each bookie named by a ledger's fragments stopped
  being registered under ``bookies/``; once one has been gone longer than
  ``lost_bookie_grace_s``, every CLOSED ledger with entries on it gets an
  ``underreplicated/<ledger>`` mark (``by: "auditor"``). When each bookie went
  missing is kept (wall-clock seconds) in the data of the ``auditor`` node, so
  a newly elected auditor goes on from there instead of waiting the whole grace
  again (a bookie back in the meantime is forgotten).
* **worker** (every process): for each marked CLOSED ledger, claims it with an
  ephemeral ``rereplication-locks/<ledger>`` node (one worker per ledger) and
  runs :func:`ledger.replication.rereplication.rereplicate_ledger`, which copies
  onto each registered bookie the mark names the entries it lacks, replaces the
  lost bookies (copies, then CASes the new fragments) and clears the mark. A
  failure leaves the mark for a later round. Marks of OPEN ledgers are left to
  their writer.

Example::

    auto = AutoRecovery(zk, paths, None, digest, "bookie-1", lost_bookie_grace_s=60,   # None: its own pool
                        max_bytes_per_s=20e6)
    auto.start()          # a daemon thread, one round every interval_s
    auto.audit_once()     # or a round by hand (tests)
    auto.stop()
"""

from __future__ import annotations

import json
import logging
import random
import threading

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from ledger import LedgerError
from ledger.client.bookie_pool import BookiePool
from ledger.codec import Digest
from ledger.metadata import CLOSED, list_ledgers, live_bookies, read_metadata
from ledger.replication.copying import TokenBucket
from ledger.replication.plan import lost_bookies, underreplicated_fragments
from ledger.replication.rereplication import rereplicate_ledger
from ledger.replication.underreplication import (
    list_underreplicated,
    mark_underreplicated,
    read_underreplicated,
)

log = logging.getLogger(__name__)


class Auditor:
    """Marks closed ledgers with entries on a bookie gone longer than the grace. Call only while elected."""

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        lost_bookie_grace_s: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.zk = zk
        self.paths = paths
        self.grace_s = lost_bookie_grace_s
        self._clock = clock
        self.missing_since: dict[str, float] = {}  # in the clock's monotonic time
        self._saved: dict[str, float] = {}  # what the auditor node holds, in wall-clock time

    def resume(self) -> None:
        """Take over the previous auditor's memory of missing bookies (call on being elected)."""
        self.missing_since.clear()
        try:
            data, _ = self.zk.get(self.paths.auditor)
            saved = json.loads(data).get("missing_since") if data else None
        except (NoNodeError, ValueError, AttributeError):
            saved = None
        if not isinstance(saved, dict):
            saved = {}
        now, wall = self._clock.monotonic(), self._clock.now()
        for bookie_id, since in saved.items():
            if isinstance(since, (int, float)) and not isinstance(since, bool):
                # A wall time in the future (clocks differ between hosts) counts as "just now".
                self.missing_since[str(bookie_id)] = now - max(0.0, wall - since)
        self._saved = dict(saved)

    def _remember(self) -> None:
        """Write when each bookie went missing into the auditor node, if that changed."""
        now, wall = self._clock.monotonic(), self._clock.now()
        keep = {b: self._saved[b] for b in self.missing_since if b in self._saved}
        keep.update({b: wall - (now - since) for b, since in self.missing_since.items() if b not in keep})
        if keep == self._saved:
            return
        try:
            self.zk.set(self.paths.auditor, json.dumps({"missing_since": keep}, sort_keys=True).encode())
            self._saved = keep
        except KazooException as exc:
            log.debug("could not record the missing bookies in the auditor node: %s", exc)

    def audit_once(self) -> list[int]:
        """One audit; returns the ids of the ledgers it marked."""
        now = self._clock.monotonic()
        live = {str(b["bookie_id"]) for b in live_bookies(self.zk, self.paths)}
        metas = []
        named: set[str] = set()
        for ledger_id in list_ledgers(self.zk, self.paths):
            try:
                meta, _ = read_metadata(self.zk, self.paths, ledger_id)
            except LedgerError:
                continue  # deleted meanwhile, or unreadable (reported by whoever reads it)
            metas.append(meta)
            named.update(m["bookie_id"] for m in meta.all_bookies())
        for bookie_id in list(self.missing_since):
            if bookie_id in live or bookie_id not in named:
                del self.missing_since[bookie_id]
        for bookie_id in named - live:
            if bookie_id not in self.missing_since:
                self.missing_since[bookie_id] = now
                log.info(
                    "auditor: bookie %s is not registered; its ledgers are marked under-replicated if it is "
                    "still gone in %.0f s",
                    bookie_id,
                    self.grace_s,
                )
        self._remember()
        marked = []
        for meta in metas:
            if meta.state != CLOSED:
                continue
            lost = lost_bookies(
                (m["bookie_id"] for m in meta.all_bookies()), live, self.missing_since, now, self.grace_s
            )
            holes = underreplicated_fragments(meta, lost)
            if not holes:
                continue
            existing = read_underreplicated(self.zk, self.paths, meta.ledger_id) or {}
            listed = {m.get("bookie_id") for m in existing.get("missing") or [] if isinstance(m, dict)}
            members = {m["bookie_id"]: m for _, _, m in holes}
            if set(members) <= listed:
                continue
            first = min(int(meta.fragments[index]["first_entry"]) for index, _, _ in holes)
            mark_underreplicated(
                self.zk,
                self.paths,
                meta.ledger_id,
                list(members.values()),
                from_entry=first,
                by="auditor",
                clock=self._clock,
            )
            log.warning(
                "auditor: ledger %d is under-replicated: bookie(s) %s gone longer than %.0f s",
                meta.ledger_id,
                ", ".join(sorted(members)),
                self.grace_s,
            )
            marked.append(meta.ledger_id)
        return marked


class ReplicationWorker:
    """Re-replicates marked closed ledgers, one claimed ledger at a time."""

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        pool: BookiePool,
        digest: Digest,
        identifier: str,
        throttle: TokenBucket | None = None,
        rng: random.Random | None = None,
        timeout: float = 5.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.zk = zk
        self.paths = paths
        self.pool = pool
        self.digest = digest
        self.identifier = identifier
        self.throttle = throttle
        self.rng = rng or random.Random()
        self.timeout = timeout
        self._clock = clock
        self.failures: dict[int, str] = {}

    def run_once(self, stop: threading.Event | None = None, only: set[int] | None = None) -> list[int]:
        """Try every marked ledger (of ``only``, if given) once; returns the ids re-replicated (mark cleared)."""
        done = []
        for ledger_id in list_underreplicated(self.zk, self.paths):
            if stop is not None and stop.is_set():
                break
            if only is not None and ledger_id not in only:
                continue
            lock = self.paths.rereplication_lock(ledger_id)
            try:
                self.zk.create(lock, self.identifier.encode(), ephemeral=True, makepath=True)
            except NodeExistsError:
                continue  # another worker has it
            try:
                try:
                    meta, _ = read_metadata(self.zk, self.paths, ledger_id)
                except LedgerError:
                    continue
                if meta.state != CLOSED:
                    continue  # the writer (or recovery) handles the open ledger
                rereplicate_ledger(
                    self.zk,
                    self.paths,
                    self.pool,
                    ledger_id,
                    self.digest,
                    throttle=self.throttle,
                    rng=self.rng,
                    timeout=self.timeout,
                    clock=self._clock,
                )
                self.failures.pop(ledger_id, None)
                done.append(ledger_id)
            except (LedgerError, KazooException) as exc:
                if self.failures.get(ledger_id) != str(exc):
                    log.warning("re-replication of ledger %d failed, retried later: %s", ledger_id, exc)
                self.failures[ledger_id] = str(exc)
            finally:
                try:
                    self.zk.delete(lock)
                except (NoNodeError, KazooException):
                    pass
        return done


class AutoRecovery:
    """The auditor (while this process holds ``auditor``) and a worker, in one daemon thread."""

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        pool: BookiePool | None,
        digest: Digest,
        identifier: str,
        lost_bookie_grace_s: float,
        max_bytes_per_s: float = 0,
        interval_s: float = 5.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.zk = zk
        self.paths = paths
        self.interval_s = interval_s
        self._clock = clock
        # Without a pool given, its own (closed by stop()): copies never queue behind, or ahead
        # of, the requests of the process it runs in (a bookie's serving, a leader's adds).
        self._own_pool = pool is None
        pool = BookiePool(clock=clock) if pool is None else pool
        self.pool = pool
        self.auditor = Auditor(zk, paths, lost_bookie_grace_s, clock=clock)
        self.worker = ReplicationWorker(
            zk,
            paths,
            pool,
            digest,
            identifier,
            throttle=TokenBucket(max_bytes_per_s, clock=clock),
            clock=clock,
        )
        self._lock = zk.Lock(paths.auditor, identifier)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_auditor(self) -> bool:
        return bool(self._lock.is_acquired)

    def _still_held(self) -> bool:
        """Whether our lock node still exists: kazoo's Lock does not notice a session expiry."""
        node = getattr(self._lock, "node", None)
        try:
            return bool(node) and self.zk.exists(f"{self._lock.path}/{node}") is not None
        except KazooException:
            return False

    def round(self) -> None:
        """One audit (if elected, or electable now) and one worker pass."""
        if self._lock.is_acquired and not self._still_held():
            log.warning("this process lost the auditor lock (ZooKeeper session expired?)")
            self._lock.is_acquired = False
        if not self._lock.is_acquired:
            try:
                if self._lock.acquire(blocking=False):
                    self.auditor.resume()
                    log.info(
                        "this process is the auditor now%s",
                        "; bookies missing already: " + ", ".join(sorted(self.auditor.missing_since))
                        if self.auditor.missing_since
                        else "",
                    )
            except KazooException as exc:
                log.debug("auditor election: %s", exc)
        if self._lock.is_acquired:
            self.auditor.audit_once()
        self.worker.run_once(self._stop)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.round()
            except (LedgerError, KazooException) as exc:
                log.warning("autorecovery round failed: %s", exc)
            except Exception:
                log.exception("autorecovery round failed")
            self._clock.wait(self._stop, self.interval_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="autorecovery", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        try:
            self._lock.release()
        except KazooException:
            pass
        if self._own_pool:
            self.pool.close()
