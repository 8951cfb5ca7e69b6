"""The back-end of `fencepost bookie list`: each bookie, the ledgers it holds, and how many are under-replicated.

Reading ZooKeeper (:func:`read_bookie_view`) is kept apart from the pure parts
(:func:`bookie_rows`, :func:`format_bookie_list`, :func:`human_bytes`), which
the unit tests call on plain dicts.

A bookie *holds* a ledger when it appears in any fragment of the ledger's
metadata. Its under-replicated count is the number of ledgers marked in
``underreplicated/`` that name it as missing copies or whose fragments hold it.
Bookies named in ledger metadata but not registered under ``bookies/`` are
listed as ``gone`` (their ZooKeeper session ended: stopped, crashed or
decommissioned).

Example::

    rows = bookie_list(zk, "dev")
    rows[0]["ledgers_held"], rows[0]["underreplicated"]
    print(format_bookie_list(rows))
"""

from __future__ import annotations

import json
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from election import ElectionError
from election.local.clock import SYSTEM_CLOCK, Clock
from election.local.human import human_bytes
from election.paths import ClusterPaths
from ledger import LedgerError
from ledger.metadata import LedgerMetadata
from ledger.replication.underreplication import list_underreplicated, read_underreplicated

UP = "up"
GONE = "gone"


def bookie_rows(
    registered: dict[str, dict],
    ledgers: list[dict],
    marks: dict[int, dict],
    leaving: dict[str, dict] | None = None,
) -> list[dict]:
    """One row per bookie, registered first then gone ones, each sorted by id. Pure.

    ``leaving``: the ``decommissioning/<id>`` nodes; such a bookie's mode and
    ``decommissioning`` are ``leaving``, or ``retired`` once it is done.

    ``registered``: bookie id -> its ``bookies/<id>`` node (``address``, ``free_bytes``, ``readonly``).
    ``ledgers``: ``{"id", "fragments": [{"first_entry", "ensemble": [{"bookie_id", "address"}]}]}``.
    ``marks``: ledger id -> its ``underreplicated/`` node (``missing``: ``[{"bookie_id", ...}]``).

    Example::

        rows = bookie_rows({"b1": {"address": "tcp://h:1", "free_bytes": 2048}},
                           [{"id": 3, "fragments": [{"first_entry": 0, "ensemble": [{"bookie_id": "b1"},
                                                                                    {"bookie_id": "b2"}]}]}],
                           {3: {"missing": [{"bookie_id": "b2"}]}})
        rows[1]["state"], rows[1]["underreplicated"]      # "gone", 1
    """
    leaving = leaving or {}
    held: dict[str, set[int]] = {}
    last_address: dict[str, str] = {}
    holders_of: dict[int, set[str]] = {}
    for ledger in ledgers:
        holders = holders_of.setdefault(ledger["id"], set())
        for fragment in ledger.get("fragments") or []:
            for member in fragment.get("ensemble") or []:
                bookie_id = str(member.get("bookie_id"))
                holders.add(bookie_id)
                held.setdefault(bookie_id, set()).add(ledger["id"])
                if member.get("address"):
                    last_address[bookie_id] = member["address"]
    under: dict[str, set[int]] = {}
    for ledger_id, mark in marks.items():
        named = {
            str(m.get("bookie_id"))
            for m in (mark or {}).get("missing") or []
            if isinstance(m, dict) and m.get("bookie_id")
        }
        for bookie_id in named | holders_of.get(ledger_id, set()):
            under.setdefault(bookie_id, set()).add(ledger_id)

    def row(bookie_id: str, node: dict | None) -> dict:
        node = node or {}
        free = node.get("free_bytes")
        return {
            "id": bookie_id,
            "state": UP if node or bookie_id in registered else GONE,
            "address": node.get("address") or last_address.get(bookie_id),
            "free_bytes": free,
            "free": human_bytes(free),
            "readonly": bool(node.get("readonly")),
            "decommissioning": (
                None
                if bookie_id not in leaving
                else "retired"
                if leaving[bookie_id].get("done")
                else "leaving"
            ),
            "ledgers_held": len(held.get(bookie_id, ())),
            "ledgers": sorted(held.get(bookie_id, ())),
            "underreplicated": len(under.get(bookie_id, ())),
            "underreplicated_ledgers": sorted(under.get(bookie_id, ())),
        }

    rows = [row(b, registered[b]) for b in sorted(registered)]
    rows += [row(b, None) for b in sorted((set(held) | set(under)) - set(registered))]
    return rows


def format_bookie_list(rows: list[dict]) -> str:
    """The text of `fencepost bookie list`: one line per bookie under a header. Pure."""
    if not rows:
        return "no bookies registered and none named in ledger metadata"
    width = max(8, *(len(r["id"]) for r in rows))
    lines = [
        f"{'ID':<{width}}  {'STATE':<5}  {'ADDRESS':<24}  {'FREE':>10}  {'MODE':<9}  {'LEDGERS':>7}  "
        f"{'UNDER-REPL':>10}"
    ]
    for r in rows:
        mode = (
            "-"
            if r["state"] == GONE
            else r["decommissioning"] or ("read-only" if r["readonly"] else "writable")
        )
        lines.append(
            f"{r['id']:<{width}}  {r['state']:<5}  {r['address'] or '-':<24}  {r['free']:>10}  "
            f"{mode:<9}  {r['ledgers_held']:>7}  {r['underreplicated']:>10}"
        )
    return "\n".join(lines)


def _json_node(zk: KazooClient, path: str) -> dict | None:
    try:
        data, _ = zk.get(path)
    except NoNodeError:
        return None
    try:
        doc = json.loads(data) if data else {}
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _children(zk: KazooClient, path: str) -> list[str]:
    try:
        return sorted(zk.get_children(path))
    except NoNodeError:
        return []


def read_bookie_view(
    zk: KazooClient, cluster: str
) -> tuple[dict[str, dict], list[dict], dict[int, dict], dict[str, dict]]:
    """The registrations, the ledgers' fragments, the under-replication marks and the bookies being
    decommissioned (the inputs of :func:`bookie_rows`)."""
    paths = ClusterPaths(cluster)
    registered = {}
    for child in _children(zk, paths.bookies):
        node = _json_node(zk, paths.bookie(child))
        if node is not None:  # gone between the listing and the read: it is not registered
            registered[child] = node
    ledgers = []
    for child in _children(zk, paths.ledgers):
        try:
            ledger_id = ClusterPaths.ledger_id_of(child)
            data, _ = zk.get(paths.ledger(ledger_id))
            meta = LedgerMetadata.from_json(data, ledger_id)
        except (
            NoNodeError,
            LedgerError,
            ElectionError,
        ):  # deleted meanwhile (retention) or not a ledger node: nothing held
            continue
        ledgers.append({"id": ledger_id, "fragments": meta.fragments})
    marks = {}
    for ledger_id in list_underreplicated(zk, paths):
        mark = read_underreplicated(zk, paths, ledger_id)
        if mark is not None:
            marks[ledger_id] = mark
    leaving = {}
    for child in _children(zk, paths.decommissioning):
        node = _json_node(zk, paths.decommissioning_bookie(child))
        if node is not None:
            leaving[child] = node
    return registered, ledgers, marks, leaving


def bookie_list(zk: KazooClient, cluster: str) -> list[dict]:
    """Every bookie of ``cluster`` as :func:`bookie_rows` describes it."""
    return bookie_rows(*read_bookie_view(zk, cluster))


def format_progress(progress: dict) -> str:
    """One line about a decommission under way (``DecommissionProgress.as_dict()``). Pure."""
    moved = len(progress["moved"])
    text = (
        f"decommissioning {progress['bookie_id']}: {progress['total'] - progress['remaining']}/"
        f"{progress['total']} ledgers moved off it"
    )
    if progress["waiting"]:
        text += (
            f"; waiting for {len(progress['waiting'])} open ledger(s) to close ({_ids(progress['waiting'])})"
        )
    if progress["problems"]:
        ledger_id, problem = next(iter(sorted(progress["problems"].items())))
        text += f"; retrying ledger {ledger_id}: {problem}"
    if moved and not progress["done"]:
        text += f" ({moved} copied by this command)"
    return text


def _ids(ids: list[int], limit: int = 5) -> str:
    shown = ", ".join(str(i) for i in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def decommission_bookie(
    zk: KazooClient,
    cluster: str,
    bookie_id: str,
    secret: bytes | None = None,
    timeout: float | None = None,
    max_bytes_per_s: float = 0.0,
    on_progress: Callable[[dict], None] = lambda progress: None,
    poll_s: float = 1.0,
    clock: Clock = SYSTEM_CLOCK,
) -> dict:
    """Decommission ``bookie_id`` (the steps of :mod:`ledger.replication.decommission`); return the last progress.

    Raises :class:`ledger.replication.decommission.DecommissionError` when it cannot start, or when
    ``timeout`` seconds pass first (the decommission stays
    under way: the bookie gets no new copies, and running the command again goes on).
    """
    from election.cluster_config import check_member_secret, read_cluster_config
    from ledger.client.bookie_pool import BookiePool
    from ledger.codec import Digest
    from ledger.replication.auditor import ReplicationWorker
    from ledger.replication.copying import TokenBucket
    from ledger.replication.decommission import (
        DecommissionError,
        decommission_round,
        finish_decommission,
        start_decommission,
    )

    paths = ClusterPaths(cluster)
    config = read_cluster_config(zk, paths)
    if config is None:
        raise LedgerError(f"cluster {cluster!r} is not initialized")
    digest = Digest.for_config(
        str(config.get("digest", "crc32c")), check_member_secret(config, secret, cluster)
    )
    start_decommission(zk, paths, bookie_id, int(config.get("ensemble_size", 3)), clock=clock)
    deadline = None if not timeout else clock.monotonic() + timeout
    pool = BookiePool(clock=clock)
    try:
        worker = ReplicationWorker(
            zk,
            paths,
            pool,
            digest,
            f"decommission-{bookie_id}",
            throttle=TokenBucket(max_bytes_per_s, clock=clock),
            clock=clock,
        )
        progress = None
        while True:
            progress = decommission_round(zk, paths, bookie_id, worker, progress)
            on_progress(progress.as_dict())
            if progress.done:
                finish_decommission(zk, paths, bookie_id, clock=clock)
                return progress.as_dict()
            if deadline is not None and clock.monotonic() >= deadline:
                raise DecommissionError(
                    f"{format_progress(progress.as_dict())} after {timeout:.0f} s; the bookie gets "
                    f"no new copies meanwhile: run the command again to go on"
                )
            clock.sleep(poll_s)
    finally:
        pool.close()
