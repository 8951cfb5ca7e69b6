"""``store inspect`` and ``store verify`` over every shard's store of the broker data dirs they are given.

A broker of a cluster of several shards keeps one store per shard (:mod:`broker.admin.shard_dirs`).
Each shard is its own replicated state machine, so its stores are compared only with each other:
the newest store and what a restart without a log would do are said per shard, from the same
rows and rules as one shard's (:mod:`broker.admin.stores`). A dir given that holds no shards'
dirs (every broker of a 1-shard cluster) is inspected exactly as before, with no ``shard``
anywhere in the report.

Example::

    report = inspect_all([Path("b1"), Path("b2")])      # b1/shards/1, b2/shards/1, ... as well
    print(format_all(report))                            # each store, then each shard's newest and restart
    verify_all(Path("b1"), cluster_id=None)              # {"ok": ..., "stores": [{"shard": 0, "ok": True, ..}]}
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from broker import BrokerError
from broker.admin.shard_dirs import shard_dirs, shard_of_dir, store_dir
from broker.admin.stores import (
    data_dir_of,
    format_inspect,
    format_rows,
    format_summary,
    inspect_stores,
    read_store,
    summarize,
)
from broker.server.store.guard import verify_store_dir


def stores_of(paths: Sequence[Path]) -> list[tuple[Path, int]]:
    """Each store the given dirs hold and its shard: a broker data dir gives its own store and then its
    shards' (``shards/<n>``); a shard's dir, or a ``state/`` dir, gives itself."""
    found = []
    for path in map(Path, paths):
        if path.is_dir() and data_dir_of(path) == path and not shard_of_dir(path):
            found.extend((d, n) for n, d in shard_dirs(path).items())
        else:
            found.append((path, shard_of_dir(data_dir_of(path)) if path.is_dir() else shard_of_dir(path)))
    return found


def inspect_all(paths: Sequence[Path], full_verify: bool = False) -> dict:
    """:func:`~broker.admin.stores.inspect_stores` of every store in ``paths``; with shards, every row
    says its ``shard`` and ``shards`` holds each shard's summary."""
    stores = stores_of(paths)
    if not any(shard for _, shard in stores):
        return inspect_stores([path for path, _ in stores], full_verify)
    rows = [{"shard": shard, **read_store(path, full_verify)} for path, shard in stores]
    by_shard: dict[int, list[dict]] = {}
    for row in rows:
        by_shard.setdefault(row["shard"], []).append(row)
    return {
        "stores": rows,
        "shards": [{"shard": shard, **summarize(by_shard[shard])} for shard in sorted(by_shard)],
        "readable": sum(r["error"] is None for r in rows),
    }


def format_all(report: dict) -> str:
    """The human form of :func:`inspect_all`'s report."""
    if "shards" not in report:
        return format_inspect(report)
    lines = format_rows(report["stores"])
    for summary in report["shards"]:
        lines.append(f"shard {summary['shard']}:")
        lines.extend(format_summary(summary, indent="  "))
    return "\n".join(lines)


def verify_all(path: Path, cluster_id: str | None = None, shard: int | None = None) -> dict:
    """``store verify`` of ``shard``'s store in broker data dir ``path``, or of every shard's: each
    store's report with ``shard`` and ``ok`` (``reason`` when it is not); ``ok`` when all are."""
    path = Path(path)
    if shard is not None:
        dirs = {shard: store_dir(path, shard)}
    elif shard_of_dir(path) or data_dir_of(path) != path:
        dirs = {shard_of_dir(data_dir_of(path)): path}
    else:
        dirs = shard_dirs(path)
    reports = []
    for n, where in dirs.items():
        try:
            reports.append({"shard": n, "ok": True, **verify_store_dir(where, cluster_id)})
        except BrokerError as exc:
            reports.append({"shard": n, "ok": False, "path": str(where), "reason": str(exc)})
    return {"ok": all(r["ok"] for r in reports), "stores": reports}
