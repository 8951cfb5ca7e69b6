"""Manual recovery of broker stores: ``fencepost store inspect DIR...`` and ``store mark-clean DIR``.

After a total failure in which no store was marked clean, a restart without a log
stops with "manual recovery needed" (``election.cluster_join``). The operator then
inspects every data dir, picks the newest store and marks it clean, so that it
seeds the restart. Inspection only reads (LMDB opened read-only, safe while a
broker runs); marking holds the data-dir lock, so no broker can start on the
store meanwhile, and verifies the whole store first.

The pure helpers (:func:`newest`, :func:`clusters`, :func:`restart_decision`,
:func:`mark_clean_problem`, :func:`format_inspect`) take the rows that
:func:`read_store` builds, so they are tested without files. The stores of a sharded
broker's data dir, one per shard, are inspected by :mod:`broker.admin.shard_stores`
with the same rows and summaries.

Example::

    report = inspect_stores([Path("b0"), Path("b1"), Path("b2")])
    print(format_inspect(report))            # each store, its cluster, the newest, what a restart does
    mark_clean_store(Path(report["newest"]), cluster_id=None, confirm=lambda plan: True)
"""

from __future__ import annotations

import datetime
import json
import uuid
from pathlib import Path
from typing import Callable, Sequence

import lmdb

from broker import BrokerError
from broker.admin.shard_dirs import is_sharded, meta_path, shard_of_dir
from broker.server.store.datalock import DataDirLock
from broker.server.store.guard import state_dir_of, verify_store_dir
from broker.state.store import StateStore
from broker.state.store_errors import StoreError, StoreIncomplete
from election import ElectionError
from election.cluster_join import (
    CLEAN,
    RESTORE,
    InitDecision,
    MemberStore,
    classify_store,
    decide_initialization,
)
from election.local.store_status import StoreStatus, mark_clean, read_status, write_status

MANUAL_PREFIX = "manual-"
# A store made before store.status existed does not know when its cluster was created.
UNKNOWN_CREATED_AT = 0.0


# ---------------------------------------------------------------- pure helpers


def task_count(depths: dict[str, dict[str, int]]) -> int:
    """Tasks in the store from its per-queue counters (``delayed`` is a subset of ``waiting``)."""
    return sum(n for counts in depths.values() for state, n in counts.items() if state != "delayed")


def _age_key(row: dict) -> tuple:
    # Epochs order stores across logs (a restored cluster's epochs go on above the old ones);
    # positions only within an epoch. A clean store wins a tie: someone vouched for it.
    return (row["epoch"], tuple(row["position"] or (-1, -1)), row["state"] == CLEAN)


def newest(rows: Sequence[dict]) -> dict | None:
    """The readable non-empty store that applied the most, or None."""
    candidates = [r for r in rows if r["error"] is None and r["kind"] in ("clean", "dirty")]
    return max(candidates, key=_age_key) if candidates else None


def clusters(rows: Sequence[dict]) -> list[dict]:
    """Readable non-empty stores grouped by initial signature, each group with its newest store."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["error"] is None and r["kind"] in ("clean", "dirty"):
            groups.setdefault((r["cluster_id"], r["created_at"]), []).append(r)
    return [
        {
            "cluster_id": cid,
            "created_at": created,
            "paths": [r["path"] for r in members],
            "newest": newest(members)["path"],
        }
        for (cid, created), members in sorted(groups.items(), key=lambda kv: -len(kv[1]))
    ]


def restart_decision(rows: Sequence[dict]) -> InitDecision | None:
    """What a restart without a log would do with the readable dirs as all the initial members."""
    readable = [r for r in rows if r["error"] is None]
    if not readable:
        return None
    members = [
        MemberStore(
            i,
            r["kind"],
            _status_of(r),
            epoch=r["epoch"] or 0,
            position=tuple(r["position"]) if r["position"] else None,
            label=r["path"],
        )
        for i, r in enumerate(readable, 1)
    ]
    return decide_initialization(members, len(members))


def _status_of(row: dict) -> StoreStatus | None:
    if row["state"] == "none":
        return None
    return StoreStatus(
        row["cluster_id"],
        row["created_at"],
        row["state"],
        row["shutdown_id"],
        tuple(row["status_position"]) if row["status_position"] else None,
    )


def mark_clean_problem(row: dict, wanted_cluster: str | None) -> str | None:
    """Why the store of ``row`` must not be marked clean, or None."""
    where = row["path"]
    if row["kind"] == "transient":
        return f"{where} holds no state store"
    if row["kind"] == "empty":
        return f"{where} holds an empty store: there is no state to seed a restart with"
    recorded, signed = row["store_cluster_id"], row["status_cluster_id"]
    if recorded is None and signed is None:
        return f"{where}: the store records no cluster id and has no store.status: it cannot be signed"
    if recorded is not None and signed is not None and recorded != signed:
        return (
            f"{where}: the store belongs to cluster {recorded} but its store.status says "
            f"{signed}: it is of another cluster"
        )
    if wanted_cluster is not None and wanted_cluster not in (recorded, signed):
        return f"{where}: the store belongs to cluster {recorded or signed}, not {wanted_cluster}"
    return None


def _when(created_at: float | None) -> str:
    if not created_at:
        return "unknown"
    return datetime.datetime.fromtimestamp(created_at, datetime.timezone.utc).isoformat(timespec="seconds")


def format_inspect(report: dict) -> str:
    """The human form of :func:`inspect_stores`'s report."""
    return "\n".join(format_rows(report["stores"]) + format_summary(report))


def format_rows(rows: Sequence[dict]) -> list[str]:
    """The lines of each store (a row with ``shard`` names it)."""
    lines = []
    for r in rows:
        where = r["path"] + (f" (shard {r['shard']})" if "shard" in r else "")
        if r["error"] is not None:
            lines.append(f"{where}: UNREADABLE: {r['error']}")
            continue
        if r["kind"] == "transient":
            lines.append(f"{where}: no state store")
            continue
        lines.append(
            f"{where}: cluster {r['cluster_id'] or '(not recorded)'}  state {r['state']}"
            f"  shutdown {r['shutdown_id'] or '-'}  created {_when(r['created_at'])}"
        )
        lines.append(
            f"    position {r['position']}  epoch {r['epoch']}  tasks {r['tasks']}  digest {r['digest']}"
            + ("  (empty)" if r["kind"] == "empty" else "")
        )
        lines.extend(f"    problem: {p}" for p in r["problems"])
    return lines


def format_summary(summary: dict, indent: str = "") -> list[str]:
    """The lines of :func:`summarize`'s clusters, newest store and restart decision."""
    lines = []
    for g in summary["clusters"]:
        lines.append(
            f"cluster {g['cluster_id'] or '(not recorded)'} (created {_when(g['created_at'])}): "
            f"{', '.join(g['paths'])}; newest {g['newest']}"
        )
    if len(summary["clusters"]) > 1:
        lines.append("the stores belong to different clusters")
    lines.append(f"newest: {summary['newest'] or '(no store holds any state)'}")
    lines.append(f"a restart without a log would: {summary['restart']['summary']}")
    if summary["restart"]["action"] == RESTORE:
        lines.append(f"    ({summary['restart']['reason']})")
    return [indent + line for line in lines]


# ---------------------------------------------------------------- file access


def data_dir_of(path: Path) -> Path:
    """The broker data dir for a data dir or for its ``state/`` given directly."""
    state = state_dir_of(path)
    return state.parent if state == path else path


def _broker_id(data_dir: Path) -> int | None:
    """The id in ``.broker.meta`` (the broker's, for a shard's dir), for the operator's orientation only
    (never trusted for a decision)."""
    try:
        value = json.loads(meta_path(data_dir).read_text()).get("broker_id")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


def _empty_row(path: Path) -> dict:
    return {
        "path": str(path),
        "error": None,
        "kind": "transient",
        "state": "none",
        "broker_id": None,
        "cluster_id": None,
        "store_cluster_id": None,
        "status_cluster_id": None,
        "created_at": None,
        "shutdown_id": None,
        "status_position": None,
        "position": None,
        "epoch": None,
        "tasks": None,
        "digest": None,
        "closed_in_order": None,
        "problems": [],
    }


def read_store(path: Path, full_verify: bool = False) -> dict:
    """One dir's row: signatures, position, epoch, tasks, digest; ``error`` says why it is unreadable.

    Read-only. ``full_verify`` recomputes the digest from every record (O(records)).
    """
    row = _empty_row(path)
    if not path.is_dir():
        return dict(row, error=f"{path} is not a directory" if path.exists() else f"{path} does not exist")
    data, state = data_dir_of(path), state_dir_of(path)
    row["broker_id"] = _broker_id(data)
    try:
        status = read_status(data)
    except ElectionError as exc:
        return dict(row, error=str(exc))
    if status is not None:
        row.update(
            state=status.state,
            cluster_id=status.cluster_id,
            status_cluster_id=status.cluster_id,
            created_at=status.created_at,
            shutdown_id=status.shutdown_id,
            status_position=list(status.position) if status.position else None,
        )
    if not (state / "data.mdb").exists():
        return row
    try:
        store = StateStore(state, readonly=True)
    except StoreIncomplete as exc:
        return dict(row, error=f"state store {state} is partial: {exc}")
    except (StoreError, OSError) as exc:
        return dict(row, error=str(exc))
    try:
        store.quick_check()
        if full_verify:
            store.verify()
        position = store.position()
        row.update(
            store_cluster_id=store.cluster_id(),
            position=list(position) if position else None,
            epoch=store.epoch(),
            digest=store.digest(),
            tasks=task_count(store.queue_depths()),
            closed_in_order=store.was_clean(),
            kind=classify_store(status, True, store.is_empty()),
        )
    except StoreError as exc:
        return dict(row, error=str(exc))
    except lmdb.Error as exc:  # the few reads that do not translate their own errors
        return dict(row, error=f"state store {state} is damaged: LMDB {type(exc).__name__}: {exc}")
    finally:
        store.close()
    row["cluster_id"] = row["cluster_id"] or row["store_cluster_id"]
    if row["store_cluster_id"] and status is not None and status.cluster_id != row["store_cluster_id"]:
        row["problems"].append(
            f"the store records cluster {row['store_cluster_id']}, its store.status {status.cluster_id}"
        )
    if row["kind"] == CLEAN and status.position is not None and list(status.position) != row["position"]:
        row["problems"].append(
            f"marked clean at {list(status.position)} but the store is at {row['position']}"
        )
    return row


def inspect_stores(paths: Sequence[Path], full_verify: bool = False) -> dict:
    """Every dir's row, the clusters they form, the newest store, and what a restart would do."""
    rows = [read_store(Path(p), full_verify) for p in paths]
    return {"stores": rows, **summarize(rows)}


def summarize(rows: Sequence[dict]) -> dict:
    """The clusters the rows' stores form, the newest store, what a restart would do with them as its
    members, and how many could be read (the stores of one shard)."""
    top = newest(rows)
    decision = restart_decision(rows)
    unread = [r["path"] for r in rows if r["error"] is not None]
    if decision is None:
        summary = "nothing: no dir could be read"
    elif decision.action == RESTORE:
        source = [r for r in rows if r["error"] is None][decision.source - 1]["path"]
        summary = f"restore from {source}"
    else:
        summary = decision.reason if decision.action != "start_empty" else "start every member empty"
    if unread and decision is not None:
        summary += f" (leaving out the unreadable {', '.join(unread)})"
    restart = {
        "summary": summary,
        "action": decision.action if decision else None,
        "reason": decision.reason if decision else None,
    }
    return {
        "clusters": clusters(rows),
        "newest": top["path"] if top else None,
        "restart": restart,
        "readable": len(rows) - len(unread),
    }


def mark_clean_store(
    path: Path,
    cluster_id: str | None,
    confirm: Callable[[dict], bool],
    new_id: Callable[[], str] = lambda: MANUAL_PREFIX + uuid.uuid4().hex,
) -> dict:
    """Mark the store in ``path`` clean at its current position with a new manual shutdown id.

    Holds the data-dir lock throughout (a running broker's lock refuses it: DataDirInUse),
    verifies the whole store, refuses another cluster's, then asks ``confirm(plan)``.
    Returns the plan with ``marked``: whether it wrote (False if already clean or not confirmed).
    """
    path = Path(path)
    if not path.is_dir():
        raise BrokerError(f"{path} is not a directory" if path.exists() else f"{path} does not exist")
    data = data_dir_of(path)
    lock = DataDirLock(data)
    lock.acquire()
    try:
        row = read_store(path)
        if row["error"] is not None:
            raise BrokerError(row["error"])
        problem = mark_clean_problem(row, cluster_id)
        if problem:
            raise BrokerError(problem)
        verify_store_dir(path, cluster_id)  # the whole store must hash to its digest
        plan = {
            "path": str(path),
            "cluster_id": row["cluster_id"],
            "position": row["position"],
            "epoch": row["epoch"],
            "tasks": row["tasks"],
            "digest": row["digest"],
            "shutdown_id": row["shutdown_id"],
            "wrote_status": row["state"] == "none",
            "marked": False,
        }
        if is_sharded(data):
            plan["shard"] = shard_of_dir(data)
        if row["state"] == CLEAN:
            return dict(plan, already_clean=True, wrote_status=False)
        plan["shutdown_id"] = new_id()
        if not confirm(plan):
            return plan
        if row["state"] == "none":
            # Made before store signatures: sign it with the cluster its records name.
            write_status(data, StoreStatus(row["store_cluster_id"], UNKNOWN_CREATED_AT))
        mark_clean(data, plan["shutdown_id"], tuple(row["position"]))
        return dict(plan, marked=True)
    finally:
        lock.release()
