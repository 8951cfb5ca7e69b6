"""Joining: bringing a store that the ledgers no longer cover up to date from a snapshot.

A store is covered when every entry after its position is still in the log;
then the follower tail just replays. An empty store, when the cluster has a
downloadable snapshot, or a store whose position lies in a deleted ledger,
installs the newest snapshot first: downloaded from a broker that serves it
(chunked, checksummed, resumable), verified, and loaded into a fresh state
directory that replaces the old one only once it is complete, so a failed join
never leaves a half-installed state. If one source fails the next is tried.
Only snapshots the log still covers are tried
(:mod:`broker.server.store.join_choice`); while none does, the joiner says why in
``snapshots/joining/<broker id>`` (:class:`JoinNotice`, read by `fencepost status`).

Example::

    if needs_snapshot(store.position(), log_ids, log_truncated=True):
        header = install_snapshot(sources, data_dir, cluster_id, request_to)
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from broker import BrokerError
from broker.admin.status import request_once
from broker.state.restore import restore_snapshot
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from ledger.log import LogGap, position_after
from snapshots import SnapshotError
from snapshots.catalog import SnapshotCatalog
from snapshots.transfer import download

log = logging.getLogger(__name__)


class JoinError(BrokerError):
    """No snapshot could be installed, so this store cannot catch up."""


def needs_snapshot(
    position: tuple[int, int] | None,
    log_ids: list[int],
    log_truncated: bool,
    seed: tuple[int, int] | None = None,
) -> bool:
    """True when replaying the log alone cannot rebuild this store's state.

    An empty store replays from the start unless ledgers were ever deleted
    (`log_truncated`); a non-empty one replays if the log still holds its position,
    or if it is the ``seed`` the log was re-created from (``ledger.log.log_seed``).
    """
    if position is None:
        return log_truncated
    if seed is not None and tuple(position) == tuple(seed):
        return False
    try:
        position_after(position, log_ids)
    except LogGap:
        return True
    return False


def snapshot_sources(zk: KazooClient, paths: ClusterPaths, own_id: int) -> list[dict]:
    """Live brokers that advertise a snapshot, the one named by `snapshots/latest` first, newest first."""
    try:
        latest = json.loads(zk.get(paths.snapshots_latest)[0] or b"{}")
    except NoNodeError:
        latest = {}
    sources = []
    try:
        children = zk.get_children(paths.live_brokers)
    except NoNodeError:
        children = []
    for child in children:
        if not child.isdigit() or int(child) == own_id:
            continue
        try:
            info = json.loads(zk.get(paths.live_broker(int(child)))[0])
        except (NoNodeError, ValueError):
            continue
        if info.get("snapshot"):
            sources.append({"broker_id": int(child), "address": info["address"], **info["snapshot"]})
    sources.sort(key=lambda s: (s["broker_id"] != latest.get("broker_id"), [-x for x in s["position"]]))
    return sources


def broker_requester(address: str, timeout: float = 10.0) -> Callable[[str, dict], dict]:
    """A function sending one request to the broker at `address` and returning its reply (raising on error)."""

    def request(op: str, fields: dict) -> dict:
        return request_once(address, op, timeout, max_bytes=64 * 1024 * 1024, **fields)

    return request


def log_truncated(zk: KazooClient, paths: ClusterPaths) -> bool:
    """True once retention has deleted ledgers (see :func:`broker.server.store.checkpoints.mark_log_start`)."""
    return zk.exists(paths.log_start) is not None


class JoinNotice:
    """Why this broker waits to join, in ``snapshots/joining/<broker id>`` (ephemeral) and the log.

    `fencepost status` shows it; :meth:`clear` removes it once a snapshot is installed.

    Example::

        notice = JoinNotice(zk, paths, broker_id, clock)
        notice.say("waiting for a snapshot that covers the log start (ledger 7): ...")
        notice.clear()
    """

    def __init__(self, zk: KazooClient, paths: ClusterPaths, broker_id: int | None, clock: Clock) -> None:
        self.zk, self.paths, self.broker_id, self.clock = zk, paths, broker_id, clock
        self.reason: str | None = None
        self.since: float | None = None

    def say(self, reason: str) -> None:
        """Publish ``reason`` (logged once each time it changes)."""
        if reason == self.reason:
            return
        log.warning("%s", reason)
        self.reason, self.since = reason, self.since or self.clock.now()
        if self.broker_id is None:
            return
        doc = json.dumps({"broker_id": self.broker_id, "reason": reason, "since": self.since}).encode()
        node = self.paths.snapshot_joiner(self.broker_id)
        try:
            try:
                self.zk.create(node, doc, ephemeral=True, makepath=True)
            except NodeExistsError:
                self.zk.set(node, doc)
        except KazooException as exc:  # only the status display suffers: the log has said it
            log.debug("could not publish the join notice: %s", exc)

    def clear(self) -> None:
        if self.reason is None or self.broker_id is None:
            return
        self.reason = self.since = None
        try:
            self.zk.delete(self.paths.snapshot_joiner(self.broker_id))
        except (NoNodeError, KazooException):
            pass


class ProgressLog:
    """Logs transfer progress about once a second: bytes, total and rate."""

    def __init__(self, what: str, clock: Clock = SYSTEM_CLOCK) -> None:
        self.what = what
        self.clock = clock
        self.started = clock.monotonic()
        self.next = self.started

    def __call__(self, done: int, total: int) -> None:
        now = self.clock.monotonic()
        if now < self.next and done < total:
            return
        self.next = now + 1.0
        rate = done / max(now - self.started, 1e-6) / 1e6
        log.info("%s: %.1f / %.1f MB (%.1f MB/s)", self.what, done / 1e6, total / 1e6, rate)


def install_snapshot(
    sources: list[dict],
    data_dir: Path,
    cluster_id: str,
    request_to: Callable[[str], Callable[[str, dict], dict]],
    clock: Clock = SYSTEM_CLOCK,
    refuse: Callable[[dict], str | None] | None = None,
) -> dict:
    """Download and install the newest snapshot from the first source that works; return its header.

    `request_to(address)` gives a function sending one request to that broker; a snapshot
    for which `refuse(info)` gives a reason is not downloaded (that source counts as failed).
    The state directory is replaced only after the new one is fully loaded.
    """
    if not sources:
        raise JoinError("this store needs a snapshot, but no live broker serves one")
    catalog = SnapshotCatalog(data_dir / "snapshots")
    errors = []
    for source in sources:
        try:
            path = download(
                request_to(source["address"]),
                catalog.directory,
                progress=ProgressLog(f"snapshot from broker {source['broker_id']}", clock),
                cluster_id=cluster_id,
                refuse=refuse,
            )
            return _replace_state(path, data_dir, cluster_id, clock)
        except (SnapshotError, BrokerError, OSError) as exc:
            log.warning("snapshot from broker %s failed: %s", source["broker_id"], exc)
            errors.append(f"broker {source['broker_id']}: {exc}")
    raise JoinError("no snapshot could be installed: " + "; ".join(errors))


def _replace_state(path: Path, data_dir: Path, cluster_id: str, clock: Clock) -> dict:
    fresh, state, old = data_dir / "state.joining", data_dir / "state", data_dir / "state.replaced"
    shutil.rmtree(fresh, ignore_errors=True)
    started = clock.monotonic()
    header = restore_snapshot(path, fresh, cluster_id)
    shutil.rmtree(old, ignore_errors=True)
    if state.exists():
        state.rename(old)
    fresh.rename(state)
    shutil.rmtree(old, ignore_errors=True)
    log.info(
        "installed snapshot at %s (%d records) in %.1fs",
        tuple(header["position"]),
        header.get("record_count", 0),
        clock.monotonic() - started,
    )
    return header
