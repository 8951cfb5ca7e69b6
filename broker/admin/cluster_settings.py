"""Back-ends of ``fencepost cluster config get|set``: the cluster-wide task settings (docs/configuration.md).

The settings live in the cluster's ``config`` node (:mod:`election.task_settings`); ``set``
changes one by a CAS on the node's version, and only once the ``cluster_settings`` flag is
enabled, because then the leader of every shard logs the change (``SettingChanged``) and every
broker acts on the logged value. Before that, a change would reach only the brokers that read
the node, and a failover to one that does not would change how tasks behave.

Example::

    report = settings_report(zk, ClusterPaths("dev"))
    print(format_settings(report))
    change_setting(zk, ClusterPaths("dev"), "retry_backoff_ms", "250")
"""

from __future__ import annotations

from typing import Any

from kazoo.client import KazooClient

from election.cluster_config import read_cluster_config
from election.features import read_enabled
from election.paths import ClusterPaths
from election.task_settings import FLAG, SETTINGS, SettingError, configured, parse_value, set_setting, setting


def settings_report(zk: KazooClient, paths: ClusterPaths, name: str | None = None) -> dict[str, Any]:
    """Each task setting (or only ``name``) with its value in the config node and its default."""
    if name is not None:
        setting(name)  # an unknown name is refused, naming the known ones
    config = read_cluster_config(zk, paths)
    if config is None:
        raise SettingError(f"cluster {paths.cluster!r} is not initialized: `fencepost cluster init` first")
    values = configured(config)
    rows = [
        {
            "name": spec.name,
            "value": values.get(spec.name),
            "set": spec.name in values,
            "default": spec.default,
            "unit": spec.unit,
            "help": spec.help,
        }
        for spec in SETTINGS.values()
        if name is None or spec.name == name
    ]
    return {"cluster": paths.cluster, "logged": FLAG in read_enabled(zk, paths), "settings": rows}


def change_setting(zk: KazooClient, paths: ClusterPaths, name: str, text: str) -> dict[str, Any]:
    """Set ``name`` to the value ``text`` gives it; SettingError for a bad one or while the flag is off."""
    value = parse_value(name, text)
    if FLAG not in read_enabled(zk, paths):
        raise SettingError(
            f"task settings change only with the {FLAG} feature enabled, so that every broker sees the "
            f"change in its log: `fencepost cluster enable-feature {FLAG}` once every member runs a "
            f"version that supports it (`fencepost cluster features`)"
        )
    old, new = set_setting(zk, paths, name, value)
    return {"cluster": paths.cluster, "name": name, "old": old, "value": new}


def _show(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g} {unit}".strip() if isinstance(value, float) else f"{value} {unit}".strip()


def format_settings(report: dict[str, Any]) -> str:
    """The report as a table; a setting the config lacks shows each broker's own option as its source."""
    lines = [f"{'setting':<26} {'value':<14} {'default':<14} source"]
    for row in report["settings"]:
        source = "cluster config" if row["set"] else "each broker's own option (not in the config)"
        lines.append(
            f"{row['name']:<26} {_show(row['value'], row['unit']):<14} "
            f"{_show(row['default'], row['unit']):<14} {source}"
        )
    if not report["logged"]:
        lines.append(
            f"changes are refused until the {FLAG} feature is enabled (`fencepost cluster features`)"
        )
    return "\n".join(lines)
