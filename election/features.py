"""Versions and feature flags (DESIGN §14): the flags this software knows, what a member advertises,
and the cluster's ``features`` node that lists the enabled ones.

Today's formats are the base and have no flag. A later change to an event, a field, a store,
snapshot or wire format that a member of the previous version would misread comes with a flag
here: every member advertises the flags its software supports (``version`` and ``features`` in
its live node or registration, :func:`advertised`), ``fencepost cluster enable-feature NAME``
enables one once every member supports it (:mod:`election.feature_table` decides), and a leader
emits the new form only while :meth:`EnabledFeatures.enabled` says so. Readers accept every form
they know, enabled or not.

``FENCEPOST_ADVERTISED_FEATURES`` (comma-separated, empty for none) replaces what a process
advertises: it exists for tests that need a member of an older version without building one,
and is no setting (docs/upgrading.md).

Example::

    zk.create(paths.live_broker(7), json.dumps({"address": a, **advertised()}).encode(), ephemeral=True)
    flags = EnabledFeatures(zk, paths)       # a DataWatch: reading it never waits on ZooKeeper
    if flags.enabled("some_flag"):
        events.append(new_form)
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.recipe.watchers import DataWatch

from election import ElectionError
from election.paths import ClusterPaths

# The software's version: one constant, also the package's (setup.cfg reads it).
SOFTWARE_VERSION = "0.4.0"

# flag -> what enabling it changes. state_digest_v4: see docs/upgrading.md for why it gates no write.
FLAGS: dict[str, str] = {
    "state_digest_v4": (
        "every broker keeps its state store in format 4 (the digest covers the primary records only), so "
        "every StateDigest is compared by every replica and every broker can load every snapshot"
    ),
    "event_outcomes": (
        "the leader writes what apply decided (the tasks and attempts each lease handed out, each lease "
        "expiry or lost worker ended, each requeue sent back) as Outcomes events, so the pipeline reads a "
        "task's story from its own events instead of replaying the whole history"
    ),
    "cluster_settings": (
        "the leader logs each change of the cluster-wide task settings (`cluster config set`) as a "
        "SettingChanged event, and every broker acts on the logged values"
    ),
    "schedules": (
        "periodic tasks (`fencepost schedule add|remove|pause|resume`): the leader writes the "
        "ScheduleAdded, ScheduleRemoved, SchedulePaused and ScheduleFired events and fires each "
        "occurrence's task"
    ),
    "task_expiry": (
        "expiry before start (`submit --expires`, `queue declare --expires`): the leader accepts the "
        "options and writes expires_ms in TaskSubmitted and QueueDeclared and the TasksExpired event; a "
        "task not started by its expiry goes to the final state expired"
    ),
    "queue_limits": (
        "queue length limits (`queue declare --max-waiting N --overflow reject|drop-oldest|dead-letter`): "
        "the leader accepts the options and writes max_waiting and overflow in QueueDeclared; a submit past "
        "the limit is refused with queue_full, or makes room by dropping or dead-lettering the oldest task"
    ),
    "rate_limits": (
        "rate and concurrency limits per queue (`queue declare --rate 100/s --max-running N`): the leader "
        "accepts the options and writes rate and max_running in QueueDeclared; leases then hand out at most "
        "that many of the queue's tasks per period, and keep at most max_running of them running"
    ),
    "revoke_running": (
        "revoking a running task (`task cancel --running`): the leader accepts running on cancel and writes "
        "it in TaskCancelled; the running attempt is then closed, the task cancelled, and its worker told on "
        "its next heartbeat stops the handler"
    ),
    "task_progress": (
        "progress from a running task (`task.progress(fraction, note)` in a handler): the leader accepts a "
        "heartbeat's progress and writes it in LeaseExtended when it changed; the task record keeps the last "
        "one, shown by `task show`, `task list`, the dashboard and the HTTP API"
    ),
}

ADVERTISED_ENV = "FENCEPOST_ADVERTISED_FEATURES"


class FeatureError(ElectionError):
    """A flag that cannot be enabled (unknown, or not supported by every member), or an unreadable node."""


def supported() -> list[str]:
    """The flags this process advertises: every flag it knows, unless ``FENCEPOST_ADVERTISED_FEATURES`` says."""
    override = os.environ.get(ADVERTISED_ENV)
    if override is None:
        return sorted(FLAGS)
    return sorted({name.strip() for name in override.split(",") if name.strip()})


def advertised() -> dict[str, Any]:
    """The fields every member adds to its live node or registration."""
    return {"version": SOFTWARE_VERSION, "features": supported()}


def parse_enabled(raw: bytes | None) -> frozenset[str]:
    """The enabled flags in the ``features`` node's data (``{"enabled": [...]}``); absent or empty: none."""
    if not raw:
        return frozenset()
    try:
        doc = json.loads(raw)
    except ValueError:
        raise FeatureError("the features node is not JSON") from None
    enabled = doc.get("enabled") if isinstance(doc, dict) else None
    if not isinstance(enabled, list) or not all(isinstance(name, str) for name in enabled):
        raise FeatureError('the features node lacks a list "enabled"')
    return frozenset(enabled)


def read_enabled(zk: KazooClient, paths: ClusterPaths) -> frozenset[str]:
    """The flags the cluster has enabled (none while the node does not exist)."""
    try:
        raw, _ = zk.get(paths.features)
    except NoNodeError:
        return frozenset()
    return parse_enabled(raw)


def check_supported(zk: KazooClient, paths: ClusterPaths, member: str) -> None:
    """Refuse to start a member that lacks a flag the cluster enabled (FeatureError naming each).

    Such a member would misread what the flag lets the others write (an event kind it does not
    know stops a replica at that entry), so it is told at start instead.
    """
    missing = sorted(read_enabled(zk, paths) - set(supported()))
    if missing:
        raise FeatureError(
            f"cluster {paths.cluster!r} has enabled feature flag(s) {', '.join(missing)}, which this "
            f"{member}'s version ({SOFTWARE_VERSION}) does not support: start it on a version that does "
            f"(a flag is never disabled; docs/upgrading.md)"
        )


def enable(zk: KazooClient, paths: ClusterPaths, name: str, check: Callable[[], None]) -> bool:
    """Add ``name`` to the enabled flags with a CAS on the node's version; False if it already was.

    ``check()`` runs before each attempt (it raises :class:`FeatureError` when a member does not
    support the flag), so a write that lost a race is decided again on what ZooKeeper holds then.
    """
    while True:
        check()
        try:
            raw, stat = zk.get(paths.features)
        except NoNodeError:
            try:
                zk.create(paths.features, _doc({name}), makepath=True)
                return True
            except NodeExistsError:
                continue
        enabled = parse_enabled(raw)
        if name in enabled:
            return False
        try:
            zk.set(paths.features, _doc(enabled | {name}), version=stat.version)
            return True
        except BadVersionError:
            continue


def _doc(enabled: set[str] | frozenset[str]) -> bytes:
    return json.dumps({"enabled": sorted(enabled)}).encode()


class EnabledFeatures:
    """The cluster's enabled flags, kept current by a kazoo DataWatch; reading never blocks.

    A leader asks it before it emits a flag-gated form; until the watch's first read arrives (or
    while the node is unreadable) nothing is enabled, which is always safe: the base forms are
    read by every member. Usage::

        flags = EnabledFeatures(zk, paths)
        event = {"type": "X", **({"new_field": v} if flags.enabled("x_new_field") else {})}
    """

    def __init__(self, zk: KazooClient, paths: ClusterPaths) -> None:
        self._enabled: frozenset[str] = frozenset()
        DataWatch(zk, paths.features, self._changed)

    def _changed(self, data: bytes | None, _stat: Any) -> None:
        try:
            self._enabled = parse_enabled(data)
        except FeatureError:
            self._enabled = frozenset()  # a damaged node enables nothing; `cluster features` names it

    def enabled(self, name: str) -> bool:
        """True once the cluster has enabled flag ``name``."""
        return name in self._enabled

    def names(self) -> frozenset[str]:
        return self._enabled
