"""Ledger entries and bookie group commits over a measured window, for per-task figures.

Two counts, both exact:

* **entries**: the ledger entries the leader wrote, from its applied position in
  ``status`` (``[ledger, entry]``) at both ends of the window. Within one ledger
  that is the difference of the entry ids; across a roll the log (``log`` in
  ZooKeeper) gives the ledgers in order and their metadata the last entry of
  each closed one (:func:`entries_between`).
* **group commits**: the ``batches`` counter of every live bookie's ``stats``
  reply, summed. One group commit is one LMDB write transaction committed
  durably (with the bookie's default fsync on: an fdatasync of the data pages,
  then one of the meta page), so it is the count of the bookies' disk syncs for
  adds. The bookies do not count fsync calls themselves; fences, deletes and
  probes sync too but are not counted (none happen in a steady window).

``entries_per_task`` and ``fsyncs_per_task`` (group commits of all bookies per
task: with 3 bookies each entry is synced on each) are what
:meth:`LedgerCounters.per_task` reports; a count that could not be taken is None.

Example::

    counters = LedgerCounters(bc.zk, bc.cluster)
    before = counters.sample()
    ...                                   # the load runs
    counters.per_task(before, counters.sample(), tasks=1200)  # {"entries_per_task": 0.31, ...}
    counters.close()
"""

from __future__ import annotations

import logging
from typing import Any

from bench.proc_stats import per_task

log = logging.getLogger(__name__)


def entries_between(
    before: list | tuple | None, after: list | tuple | None, log_ids: list[int], last_entries: dict[int, int]
) -> int | None:
    """Entries after position ``before`` up to and including ``after`` (positions are ``(ledger, entry)``).

    ``log_ids`` are the log's ledger ids in order and ``last_entries`` the last
    entry id of each closed ledger (entry ids start at 0). None when a position is
    missing, a ledger is not in the log, a ledger crossed is not closed yet, or
    ``after`` is behind ``before``.

    >>> entries_between((7, 10), (7, 25), [7], {})
    15
    >>> entries_between((7, 98), (9, 4), [7, 8, 9], {7: 99, 8: 49})
    56
    """
    if not before or not after:
        return None
    (l0, e0), (l1, e1) = before, after
    if l0 == l1:
        return e1 - e0 if e1 >= e0 else None
    if l0 not in log_ids or l1 not in log_ids or log_ids.index(l1) < log_ids.index(l0):
        return None
    crossed = log_ids[log_ids.index(l0) : log_ids.index(l1)]
    if any(last_entries.get(lid, -1) < 0 for lid in crossed):
        return None
    middle = sum(last_entries[lid] + 1 for lid in crossed[1:])
    return (last_entries[l0] - e0) + middle + (e1 + 1)


def group_commits(stats: list[dict | None]) -> int | None:
    """The ``batches`` of every bookie's ``stats`` reply, summed; None if one did not answer."""
    if not stats or any(s is None or not isinstance(s.get("batches"), int) for s in stats):
        return None
    return sum(s["batches"] for s in stats)


class LedgerCounters:
    """Samples a fencepost cluster's leader position and bookies' group commits (see the module docstring).

    Holds one ZooKeeper session and one client until :meth:`close`.
    """

    def __init__(self, zk: str, cluster: str) -> None:
        from broker.api.client import Client
        from election.paths import ClusterPaths
        from election.zk import connect

        self.paths = ClusterPaths(cluster)
        self.zk = connect(zk, session_timeout=10.0)
        self.client = Client(zk=zk, cluster=cluster, timeout=10.0)

    def close(self) -> None:
        from election.zk import close

        self.client.close()
        close(self.zk)

    def __enter__(self) -> "LedgerCounters":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def sample(self) -> dict:
        """The leader's ``position`` and ``requests`` counter, the bookies' summed ``group_commits`` (None: unknown)."""
        from ledger.metadata import live_bookies

        try:
            status = self.client.status()
        except Exception as exc:  # noqa: BLE001 - the figure is left out, the round still counts
            log.warning("leader status unavailable: %s", exc)
            status = {}
        bookies = live_bookies(self.zk, self.paths)
        return {
            "position": status.get("position"),
            "requests": (status.get("counters") or {}).get("requests"),
            "group_commits": group_commits([self._stats(b) for b in bookies]),
            "bookies": len(bookies),
        }

    @staticmethod
    def _stats(bookie: dict) -> dict | None:
        from election.wire.exchange import exchange

        try:
            reply = exchange(bookie["address"], "stats", timeout=5.0)
        except Exception as exc:  # noqa: BLE001
            log.warning("bookie %s did not answer stats: %s", bookie.get("bookie_id"), exc)
            return None
        return reply if reply.get("ok") else None

    def entries(self, before: list | None, after: list | None) -> int | None:
        """Entries between two positions; reads the log and ledger metadata only across a roll."""
        if not before or not after or before[0] == after[0]:
            return entries_between(before, after, [], {})
        from ledger.log import read_log
        from ledger.metadata import read_metadata

        log_ids = [x["id"] for x in read_log(self.zk, self.paths)[0]]
        if before[0] not in log_ids or after[0] not in log_ids:
            return None
        crossed = log_ids[log_ids.index(before[0]) : log_ids.index(after[0])]
        last = {lid: read_metadata(self.zk, self.paths, lid)[0].last_entry for lid in crossed}
        return entries_between(before, after, log_ids, last)

    def counts(self, before: dict, after: dict) -> dict:
        """``entries``, ``group_commits`` and leader ``requests`` between two samples (None: unknown)."""
        out: dict = {"entries": self.entries(before["position"], after["position"])}
        for key in ("group_commits", "requests"):
            known = before[key] is not None and after[key] is not None
            out[key] = after[key] - before[key] if known else None
        if before["bookies"] != after["bookies"]:  # a bookie came or went: its counter is not in both sums
            out["group_commits"] = None
        return out

    def per_task(self, before: dict, after: dict, tasks: int) -> dict:
        """``entries_per_task`` and ``fsyncs_per_task`` (bookie group commits) over the window."""
        counts = self.counts(before, after)
        return {
            "entries_per_task": per_task(counts["entries"], tasks, 3),
            "fsyncs_per_task": per_task(counts["group_commits"], tasks, 3),
        }
