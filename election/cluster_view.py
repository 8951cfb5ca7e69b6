"""A read-only view of a cluster, assembled from its ZooKeeper nodes (`fencepost status`).

Example::

    view = cluster_status(zk, "dev")
    print(format_status(view))
"""

from __future__ import annotations

import json

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from election import ElectionError
from election.live import live_brokers
from election.local.clock import SYSTEM_CLOCK
from election.local.human import human_age, human_bytes
from election.paths import ClusterPaths


def _read_json(zk: KazooClient, path: str):
    try:
        data, _ = zk.get(path)
    except NoNodeError:
        return None
    try:
        return json.loads(data) if data else None
    except ValueError:
        return {"error": f"unreadable node {path}"}


def _children(zk: KazooClient, path: str) -> list[str]:
    try:
        return sorted(zk.get_children(path))
    except NoNodeError:
        return []


def fragment_count(meta: dict) -> int:
    """How many fragments a ledger's metadata JSON lists (a node written before fragments has one). Pure."""
    fragments = meta.get("fragments") if isinstance(meta, dict) else None
    if isinstance(fragments, list) and fragments:
        return len(fragments)
    return 1 if isinstance(meta, dict) and meta.get("ensemble") else 0


def underreplicated_ids(children: list[str]) -> list[int]:
    """The ledger ids of ``underreplicated/`` node names (``L<10 digits>``), ascending; others ignored. Pure."""
    ids = []
    for child in children:
        try:
            ids.append(ClusterPaths.ledger_id_of(child))
        except ElectionError:
            continue
    return sorted(ids)


def cluster_status(zk: KazooClient, cluster: str) -> dict:
    """Everything `fencepost status` shows, as one JSON-ready dict."""
    paths = ClusterPaths(cluster)
    config = _read_json(zk, paths.config)
    leader = _read_json(zk, paths.leader)
    epoch = _read_json(zk, paths.epoch)
    bookies = [{"id": b, **(_read_json(zk, paths.bookie(b)) or {})} for b in _children(zk, paths.bookies)]
    underreplicated = underreplicated_ids(_children(zk, paths.underreplicated))
    ledgers = []
    for node in _children(zk, paths.ledgers):
        meta = _read_json(zk, f"{paths.ledgers}/{node}") or {}
        ledger_id = ClusterPaths.ledger_id_of(node)
        ledgers.append(
            {
                "id": ledger_id,
                "state": meta.get("state"),
                "epoch": meta.get("epoch"),
                "last_entry": meta.get("last_entry"),
                "ensemble": [m.get("bookie_id") for m in meta.get("ensemble", [])],
                "fragments": fragment_count(meta),
                "underreplicated": ledger_id in underreplicated,
            }
        )
    brokers = [{"id": broker_id, **info} for broker_id, info in live_brokers(zk, paths).items()]
    log = _read_json(zk, paths.log) or {"ledgers": []}
    insync = _read_json(zk, paths.insync)
    return {
        "cluster": cluster,
        "cluster_id": (config or {}).get("cluster_id"),
        "initialized": config is not None,
        "leader": (leader or {}).get("broker_id"),
        "leader_address": (leader or {}).get("address"),
        "epoch": epoch.get("epoch") if isinstance(epoch, dict) else epoch,
        # Secure: every live member serves CURVE with keys checked (they say so in their ZooKeeper nodes).
        "secure": bool(brokers or bookies) and all(m.get("secure") for m in brokers + bookies),
        "plain_members": [f"broker {b['id']}" for b in brokers if not b.get("secure")]
        + [f"bookie {b['id']}" for b in bookies if not b.get("secure")],
        "brokers": brokers,
        "insync": (insync or {}).get("members", []),
        "bookies": bookies,
        "ledgers": ledgers,
        "underreplicated": {"count": len(underreplicated), "ledgers": underreplicated},
        "log": [entry.get("id") for entry in log.get("ledgers", [])],
        "queues": (leader or {}).get("queues", {}),
    }


def _secure_text(view: dict) -> str:
    if view.get("secure"):
        return "yes (CURVE: encrypted, every client key and role checked)"
    plain, total = view.get("plain_members", []), len(view["brokers"]) + len(view["bookies"])
    if plain and len(plain) < total:
        return f"PARTLY: plain-text members: {', '.join(plain)}"
    return "no (plain text: anyone reaching a port may use it)"


def format_status(view: dict, now: float | None = None) -> str:
    """Human-readable text for a :func:`cluster_status` view (sizes and ages for people).

    ``now``: wall-clock seconds the ages are counted to (None: the system clock's now).

    A view completed by ``broker.admin.status.full_status`` also says which brokers answer: a
    leader that does not is marked, since ZooKeeper names it until its session expires.
    """
    now = SYSTEM_CLOCK.now() if now is None else now
    if not view["initialized"]:
        return f"cluster {view['cluster']!r}: not initialized (no config node yet)"
    leader = view["leader"] if view["leader"] is not None else "-"
    if view.get("leader_reachable") is False:
        leader = (
            f"{leader} NOT ANSWERING (ZooKeeper still names it until its session expires; "
            "another broker takes over then)"
        )
    lines = [
        f"cluster {view['cluster']} ({view['cluster_id']})",
        f"leader: {leader}  epoch: {view['epoch'] if view['epoch'] is not None else '-'}",
        f"secure: {_secure_text(view)}",
    ]
    # Why nobody leads, when the brokers say (`broker start --wait-for`, too few bookies, `cluster shutdown`).
    if view.get("waiting"):
        lines.append(
            f"no leader: waiting for {view['waiting']['waiting_for']} members "
            f"({view['waiting']['present']} present)"
        )
    if (view.get("waiting_bookies") or {}).get("reason"):
        lines.append(f"no leader: {view['waiting_bookies']['reason']}")
    elif view.get("waiting_bookies"):
        lines.append(
            f"no leader: waiting for {view['waiting_bookies']['waiting_for']} bookies, "
            f"{view['waiting_bookies']['live']} live (a new ledger needs them; see `bookies` below)"
        )
    for joiner in view.get("joining") or []:
        lines.append(f"broker {joiner.get('broker_id')} not joined yet: {joiner.get('reason')}")
    if view.get("shutdown"):
        lines.append(
            f"cluster shutdown {view['shutdown'].get('shutdown_id')} recorded (members "
            f"{view['shutdown'].get('members')}): only brokers restarted on the stores it left clean may lead"
        )
    lines.append(f"brokers ({len(view['brokers'])}):")
    for b in view["brokers"]:
        # Who may lead: in-sync members, and learners (which never may) marked apart.
        mark = "in-sync" if b["id"] in view["insync"] else ("learner" if b.get("learner") else "-")
        lines.append(
            f"  {b['id']:<4} {b.get('role', '?'):<9} {mark:<8} {b.get('address', '?')}  "
            f"position={b.get('position')}  lag={'-' if b.get('lag') is None else b['lag']}  "
            f"digest={str(b.get('digest', '-'))[:12]}  updated {human_age(b.get('updated_at'), now)}"
            + ("  NOT ANSWERING" if b.get("reachable") is False else "")
        )
    # The in-sync set is marked on each broker above; members that are not live are worth a line.
    gone = [member for member in view["insync"] if member not in {b["id"] for b in view["brokers"]}]
    if gone:
        lines.append(f"in-sync members not live: {', '.join(str(m) for m in gone)}")
    lines.append(f"bookies ({len(view['bookies'])}):")
    for b in view["bookies"]:
        lines.append(
            f"  {b['id']:<24} {b.get('address', '?')}  free {human_bytes(b.get('free_bytes'))}"
            + ("  read-only" if b.get("readonly") else "")
        )
    lines.append(f"ledgers ({len(view['ledgers'])}):")
    for led in view["ledgers"]:
        lines.append(
            f"  L{led['id']:<10} {led['state'] or '?':<11} epoch={led['epoch']} last_entry={led['last_entry']} "
            f"fragments={led.get('fragments', '?')} ensemble={','.join(str(e) for e in led['ensemble'])}"
            + ("  UNDER-REPLICATED" if led.get("underreplicated") else "")
        )
    under = view.get("underreplicated") or {"count": 0, "ledgers": []}
    lines.append(
        f"under-replicated ledgers: {under['count']}"
        + (
            f" ({', '.join(f'L{i}' for i in under['ledgers'])}; see `fencepost bookie list`)"
            if under["count"]
            else ""
        )
    )
    if view["queues"]:
        lines.append("queues:")
        for name, depth in sorted(view["queues"].items()):
            counts = "  ".join(f"{state}={n}" for state, n in depth.items() if n)
            lines.append(f"  {name:<20} {counts or 'empty'}")
    return "\n".join(lines)
