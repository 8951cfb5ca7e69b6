"""Back-ends of ``fencepost cluster features`` and ``fencepost cluster enable-feature`` (docs/upgrading.md).

The members are read from ZooKeeper: every registered broker (``brokers/ids``) with what its live
node advertises (none if it is down), every live bookie with what its registration advertises.
The decision is :mod:`election.feature_table`'s, the CAS write :func:`election.features.enable`'s.

Example::

    report = features_report(zk, ClusterPaths("dev"))
    print(format_features(report))
    enable_feature(zk, ClusterPaths("dev"), "state_digest_v4")   # FeatureError names who lacks it
"""

from __future__ import annotations

import json

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from election.feature_table import Member, decide, rows
from election.features import FLAGS, SOFTWARE_VERSION, FeatureError, enable, read_enabled
from election.live import read_live_broker
from election.paths import ClusterPaths


def _member(kind: str, member_id: str, info: dict | None) -> Member:
    if info is None:
        return Member(kind, member_id, False, None, ())
    features = info.get("features")
    version = info.get("version")
    return Member(
        kind,
        member_id,
        True,
        version if isinstance(version, str) else None,
        tuple(name for name in features if isinstance(name, str)) if isinstance(features, list) else (),
    )


def read_members(zk: KazooClient, paths: ClusterPaths) -> list[Member]:
    """Every registered broker (live or not) and every live bookie, with what each advertises."""
    members = []
    try:
        broker_ids = sorted(int(child) for child in zk.get_children(paths.broker_ids) if child.isdigit())
    except NoNodeError:
        broker_ids = []
    for broker_id in broker_ids:
        members.append(_member("broker", str(broker_id), read_live_broker(zk, paths, broker_id)))
    try:
        bookie_ids = sorted(zk.get_children(paths.bookies))
    except NoNodeError:
        bookie_ids = []
    for bookie_id in bookie_ids:
        try:
            raw, _ = zk.get(paths.bookie(bookie_id))
        except NoNodeError:
            continue  # gone between the listing and the read: not live
        try:
            info = json.loads(raw)
        except ValueError:
            info = {}
        members.append(_member("bookie", bookie_id, info if isinstance(info, dict) else {}))
    return members


def features_report(zk: KazooClient, paths: ClusterPaths) -> dict:
    """The table of ``cluster features``: each flag, whether it is enabled, who supports it; the members."""
    members = read_members(zk, paths)
    enabled = read_enabled(zk, paths)
    return {
        "cluster": paths.cluster,
        "software_version": SOFTWARE_VERSION,
        "flags": rows(FLAGS, enabled, members),
        "members": [
            {"member": m.name, "live": m.live, "version": m.version, "features": list(m.features)}
            for m in members
        ],
    }


def enable_feature(zk: KazooClient, paths: ClusterPaths, name: str) -> dict:
    """Enable flag ``name`` if every member supports it; raise :class:`FeatureError` naming who does not."""

    def check() -> None:
        decision = decide(name, FLAGS, read_members(zk, paths))
        if not decision.allowed:
            raise FeatureError(decision.reason)

    changed = enable(zk, paths, name, check)
    return {"flag": name, "enabled": True, "changed": changed}


def format_features(report: dict) -> str:
    """The human form of :func:`features_report`."""
    lines = []
    for row in report["flags"]:
        state = "enabled" if row["enabled"] else "disabled"
        lines.append(f"{row['flag']}: {state}" + ("" if row["known"] else " (unknown to this software)"))
        if row["description"]:
            lines.append(f"  {row['description']}")
        lines.append(f"  supported by: {', '.join(row['supported_by']) or 'nobody'}")
        if row["not_supported_by"]:
            lines.append(f"  not supported by: {', '.join(row['not_supported_by'])}")
    if not report["flags"]:
        lines.append("no feature flags known or enabled")
    lines.append("members:")
    for m in report["members"]:
        if not m["live"]:
            lines.append(f"  {m['member']}: down")
        else:
            lines.append(f"  {m['member']}: version {m['version'] or 'unknown (older than flags)'}")
    return "\n".join(lines)
