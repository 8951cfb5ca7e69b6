"""Cluster-wide task settings (DESIGN §14): how tasks behave, the same on every broker.

Result TTL, retry backoff, the default lease, the worker-lost time and the in-sync thresholds
live in the cluster's ``config`` node under ``task_settings``, so a failover never changes
them. ``fencepost cluster init`` writes them (its options; the brokers' defaults otherwise),
``fencepost cluster config set KEY VALUE`` changes one by a CAS on the node's version, and
once the ``cluster_settings`` flag is enabled the leader of every shard logs each change as a
``SettingChanged`` event, so every replica and the pipeline see when it took effect.

What a broker acts on, for each setting (:func:`effective`): the value its log recorded
(``SettingChanged`` applied to its store), else the ``config`` node's, else its own option
(a cluster initialised before task settings existed has none in its ``config``). A standing
rule (``allow_lagging_leader``) is the ``config`` node's first: a shard with no leader must
still see it change.

This module is pure except :func:`set_setting`, :func:`add_missing` and :class:`ConfigSettingsWatch`.

Example::

    value = parse_value("retry_backoff_ms", "250")          # 250, range-checked
    set_setting(zk, paths, "retry_backoff_ms", value)       # CAS on the config node
    watch = ConfigSettingsWatch(zk, paths)                  # a DataWatch; reading never blocks
    effective("retry_backoff_ms", store.task_settings(), watch.settings(), broker_config)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError
from kazoo.recipe.watchers import DataWatch

from election import ElectionError
from election.paths import ClusterPaths

log = logging.getLogger(__name__)

# The flag that lets a leader log SettingChanged (election.features) and `cluster config set` change one.
FLAG = "cluster_settings"
CONFIG_KEY = "task_settings"
_MAX_SPAN_MS = 1 << 40  # the longest span an event may carry (broker.state.events.MAX_SPAN_MS)
_THIRTY_DAYS_S = 30 * 86400


class SettingError(ElectionError):
    """An unknown setting or a value out of its range; the message names both."""


@dataclass(frozen=True)
class Setting:
    """One task setting: its type, range, default and meaning (the broker option of the same name)."""

    name: str
    kind: type  # int, float or bool
    default: Any
    unit: str
    help: str
    low: float = 0
    high: float = _MAX_SPAN_MS
    low_open: bool = False
    # A standing rule, read while the shard may have no leader to log a change: the config node's
    # value wins over the log's, so `cluster config set` can let a leaderless shard elect one.
    standing: bool = False

    def check(self, value: Any) -> Any:
        """``value`` if it fits (an int is accepted for a float setting); SettingError otherwise."""
        if self.kind is bool:
            if type(value) is not bool:
                raise SettingError(f"{self.name} must be true or false, got {value!r}")
            return value
        if type(value) is bool or not isinstance(value, (int, float)):
            raise SettingError(f"{self.name} must be a number, got {value!r}")
        if self.kind is int and type(value) is not int:
            raise SettingError(f"{self.name} must be an integer, got {value!r}")
        value = float(value) if self.kind is float else value
        too_low = value <= self.low if self.low_open else value < self.low
        if too_low or value > self.high or value != value:
            low = f"above {self.low:g}" if self.low_open else f"at least {self.low:g}"
            raise SettingError(
                f"{self.name} must be {low} and at most {self.high:g} {self.unit}, got {value!r}"
            )
        return value


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "default_lease_ms",
            int,
            30_000,
            "ms",
            "Lease length for a lease or heartbeat that names none.",
            low=1,
        ),
        Setting(
            "retry_backoff_ms",
            int,
            1000,
            "ms",
            "Retry backoff of a failed task whose submit and queue set none: its first retry waits this "
            "long, each later one twice as long as the one before (0: retry at once).",
        ),
        Setting("retry_backoff_max_ms", int, 300_000, "ms", "Cap of the default retry backoff."),
        Setting(
            "worker_lost_s",
            float,
            60.0,
            "s",
            "A worker not heard of for this long, and holding no lease that still runs, is lost (WorkerLost).",
            low=0.5,
            high=_THIRTY_DAYS_S,
        ),
        Setting(
            "result_ttl_s",
            float,
            0.0,
            "s",
            "Purge finished tasks this long after they finished, in queues that set no result_ttl; 0 keeps them.",
            high=_MAX_SPAN_MS / 1000,
        ),
        Setting(
            "max_lag_entries",
            int,
            1000,
            "entries",
            "A follower within this many entries of the leader may be in the in-sync set.",
            high=1 << 31,
        ),
        Setting(
            "max_time_not_caught_up_s",
            float,
            10.0,
            "s",
            "Seconds a follower may go without reaching the leader's position before it leaves the in-sync set.",
            low_open=True,
            high=_THIRTY_DAYS_S,
        ),
        Setting(
            "allow_lagging_leader",
            bool,
            True,
            "",
            "With no in-sync member alive, let a broker outside the in-sync set lead.",
            standing=True,
        ),
    )
}


def setting(name: str) -> Setting:
    """The setting called ``name``; SettingError naming the known ones otherwise."""
    try:
        return SETTINGS[name]
    except KeyError:
        raise SettingError(f"no task setting {name!r} (known: {', '.join(SETTINGS)})") from None


def parse_value(name: str, text: str) -> Any:
    """The value ``text`` gives setting ``name`` (as typed on a command line), range-checked."""
    spec = setting(name)
    if spec.kind is bool:
        words = {
            "true": True,
            "on": True,
            "yes": True,
            "1": True,
            "false": False,
            "off": False,
            "no": False,
            "0": False,
        }
        if text.strip().lower() not in words:
            raise SettingError(f"{name} must be true or false, got {text!r}")
        return words[text.strip().lower()]
    try:
        value = int(text) if spec.kind is int else float(text)
    except ValueError:
        raise SettingError(
            f"{name} must be {'an integer' if spec.kind is int else 'a number'}, got {text!r}"
        ) from None
    return spec.check(value)


def checked(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with every name known and every value in range; SettingError on the first that is not."""
    return {name: setting(name).check(value) for name, value in settings.items()}


def configured(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The task settings a ``config`` node's content holds (none for a cluster made before them).

    A value this version does not accept is left out with a warning: the broker then acts on
    its log's record or its own option, never on a value it cannot check.
    """
    raw = (config or {}).get(CONFIG_KEY) or {}
    out = {}
    for name, value in raw.items() if isinstance(raw, dict) else ():
        try:
            out[name] = setting(name).check(value)
        except SettingError as exc:
            log.warning("the cluster's config holds a task setting this broker cannot use: %s", exc)
    return out


def effective(name: str, recorded: Mapping[str, Any], config_settings: Mapping[str, Any], own: Any) -> Any:
    """What a broker acts on for ``name``: its log's record, else the config node's, else its option.

    A standing rule is the config node's first: it decides whether a broker may stand when there
    may be no leader to log it."""
    if SETTINGS[name].standing and name in config_settings:
        return config_settings[name]
    if name in recorded:
        return recorded[name]
    if name in config_settings:
        return config_settings[name]
    return getattr(own, name)


def unrecorded(config_settings: Mapping[str, Any], recorded: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The config node's settings the log has not recorded with that value, in a fixed order."""
    return [(n, v) for n, v in sorted(config_settings.items()) if n not in recorded or recorded[n] != v]


def defaults(own: Any = None) -> dict[str, Any]:
    """Every setting's value: ``own``'s attribute of that name when given (a broker's options), else the default."""
    return {name: spec.check(getattr(own, name, spec.default)) for name, spec in SETTINGS.items()}


def set_setting(zk: KazooClient, paths: ClusterPaths, name: str, value: Any) -> tuple[Any, Any]:
    """Write one setting into the ``config`` node by CAS on its version; (old value or None, new value)."""
    value = setting(name).check(value)
    while True:
        try:
            raw, stat = zk.get(paths.config)
        except NoNodeError:
            raise SettingError(
                f"cluster {paths.cluster!r} is not initialized: `fencepost cluster init` first"
            ) from None
        config = json.loads(raw)
        settings = dict(config.get(CONFIG_KEY) or {})
        old = settings.get(name)
        settings[name] = value
        config[CONFIG_KEY] = settings
        try:
            zk.set(paths.config, json.dumps(config).encode(), version=stat.version)
            return old, value
        except BadVersionError:
            continue  # another change went in between: decide again on what is there now


def add_missing(zk: KazooClient, paths: ClusterPaths, own: Mapping[str, Any]) -> dict[str, Any]:
    """Put each of ``own`` (a broker's options) the ``config`` node lacks into it, by CAS; the settings then.

    A config a bookie created, or one from before task settings, holds none: the first broker to
    start writes what it would act on, so the next broker acts on the same values, not its own.
    """
    own = checked(own)
    while True:
        raw, stat = zk.get(paths.config)
        config = json.loads(raw)
        settings = dict(config.get(CONFIG_KEY) or {})
        missing = {name: value for name, value in own.items() if name not in settings}
        if not missing:
            return settings
        config[CONFIG_KEY] = {**settings, **missing}
        try:
            zk.set(paths.config, json.dumps(config).encode(), version=stat.version)
            log.info(
                "the cluster's config had no %s: this broker's options written", ", ".join(sorted(missing))
            )
            return config[CONFIG_KEY]
        except BadVersionError:
            continue  # another broker or a `config set` went in between: look again


class ConfigSettingsWatch:
    """The ``config`` node's task settings, kept current by a kazoo DataWatch; reading never blocks.

    Until the first read arrives the settings are empty, so a broker acts on its log's record or
    its own options. ``changed`` (optional) is called on kazoo's thread after each change and must
    not block. Usage::

        watch = ConfigSettingsWatch(zk, paths, changed=wake_loop)
        watch.settings()   # {"retry_backoff_ms": 250, ...}
    """

    def __init__(self, zk: KazooClient, paths: ClusterPaths, changed: Any = None) -> None:
        self._settings: dict[str, Any] = {}
        self._changed = changed
        DataWatch(zk, paths.config, self._on_data)

    def _on_data(self, data: bytes | None, _stat: Any) -> None:
        try:
            self._settings = configured(json.loads(data) if data else None)
        except ValueError:
            log.warning("the cluster's config node is not JSON: task settings from the log and options")
            self._settings = {}
        if self._changed is not None:
            self._changed()

    def settings(self) -> dict[str, Any]:
        return self._settings
