"""What the dashboard shows: one JSON-ready snapshot of the cluster, refreshed by a watcher thread.

:func:`cluster_snapshot` reads ZooKeeper (leader, epoch, live brokers, in-sync set,
bookies, ledgers) and asks the leader for its ``status`` (queue depths, its position),
the first dead tasks (with their errors) and its workers, with a short timeout
(:mod:`broker.admin.dashboard.leaders`). Only named fields are copied out
(:func:`_broker_row`, :func:`_bookie_row`, :func:`_dead_row`, :func:`_worker_row`,
:func:`_shard_row`): nothing else the nodes hold reaches the page, no payload nor result
in particular.

On a cluster of several shards the snapshot has a row per shard in ``shards`` (as
`fencepost shard list` shows it: leader, preferred leader, epoch, in-sync set, the
leader's position, whether it answers), every shard's leader is asked, and the queues,
dead tasks and workers are merged over the shards; each broker row says which shards
the broker leads (``leads``). ``leader``, ``epoch`` and the brokers' roles, in-sync flags
and positions stay shard 0's. A cluster of one shard has ``shards`` empty and its page as
before shards.

:class:`ClusterWatcher` takes a snapshot every ``interval`` seconds and adds what
needs history: queue rates (tasks in, done and dead per second over the last
:data:`RATE_WINDOW_S` seconds, only while every shard's leader answers) and the leader
changes it has seen (``failovers``, each naming its shard on a cluster of several).

Example::

    watcher = ClusterWatcher(zk, "dev", interval=1.0)
    watcher.start()
    watcher.latest_json()      # b'{"cluster": "dev", "leader": {...}, ...}'
    watcher.stop()
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from typing import Any

from kazoo.client import KazooClient

from broker.admin.dashboard.leaders import ask_leaders, merged_dead, merged_queues, merged_workers
from broker.admin.status import lag, with_reports
from election.cluster_view import cluster_status
from election.local.clock import SYSTEM_CLOCK, Clock
from election.shard_view import shard_count, shard_rows

log = logging.getLogger(__name__)

RATE_WINDOW_S = 10.0
FAILOVERS_KEPT = 20
# Queue states whose growth is a rate worth showing (the count of tasks that reached them).
RATE_STATES = ("done", "dead")


def _broker_row(broker: dict, insync: list, leader_id: Any, leader_position: list | None) -> dict:
    position = broker.get("position")
    return {
        "id": broker.get("id"),
        "name": broker.get("name"),
        "address": broker.get("address"),
        "role": broker.get("role"),
        "learner": bool(broker.get("learner")),
        "position": position,
        "epoch": broker.get("epoch"),
        "in_sync": broker.get("id") in insync,
        "leader": broker.get("id") == leader_id,
        "lag": 0 if broker.get("id") == leader_id and leader_position else lag(position, leader_position),
    }


def _bookie_row(bookie: dict) -> dict:
    return {
        "id": bookie.get("id"),
        "address": bookie.get("address"),
        "free_bytes": bookie.get("free_bytes"),
        "readonly": bool(bookie.get("readonly")),
    }


def _dead_row(task: dict) -> dict:
    return {
        "id": task.get("id"),
        "queue": task.get("queue"),
        "attempts": task.get("attempts"),
        "finished_ms": task.get("finished_ms"),
        "error": task.get("error"),
        # How far its handler got ({fraction, note, attempt}; task_progress flag), None if it said nothing.
        "progress": task.get("progress"),
    }


def _worker_row(worker: dict) -> dict:
    return {
        "worker": worker.get("worker"),
        "queues": list(worker.get("queues") or []),
        "in_hand": worker.get("in_hand"),
        "last_seen_ms": worker.get("last_seen_ms"),
    }


def _shard_row(row: dict) -> dict:
    return {
        "shard": row["shard"],
        "leader": row["leader"],
        "preferred_leader": row["preferred_leader"],
        "epoch": row["epoch"],
        "insync": list(row["insync"]),
        "position": row["position"],
        "address": row["leader_address"],
        # None while no broker leads the shard.
        "reachable": row.get("leader_reachable"),
    }


def cluster_snapshot(
    zk: KazooClient, cluster: str, timeout: float = 1.0, clock: Clock = SYSTEM_CLOCK
) -> dict:
    """The page's view of ``cluster`` now (without rates and failovers, which need history)."""
    view = cluster_status(zk, cluster)
    address = view.get("leader_address")
    shards = shard_rows(zk, cluster) if shard_count(zk, cluster) > 1 else []
    answers = ask_leaders([address] + [row["leader_address"] for row in shards[1:]], timeout)
    report = answers[0].status if answers[0] else None
    leader_position = report.get("position") if report else None
    insync = list(view.get("insync") or [])
    shards = with_reports(shards, [answer.status if answer else None for answer in answers])
    brokers = [_broker_row(b, insync, view.get("leader"), leader_position) for b in view["brokers"]]
    if shards:
        for broker in brokers:
            broker["leads"] = [row["shard"] for row in shards if row["leader"] == broker["id"]]
    dead, workers = merged_dead(answers), merged_workers(answers)
    return {
        "cluster": view["cluster"],
        "cluster_id": view.get("cluster_id"),
        "initialized": view["initialized"],
        "taken_at": clock.now(),
        "epoch": view.get("epoch"),
        "leader": None
        if view.get("leader") is None
        else {
            "id": view["leader"],
            "address": address,
            "reachable": report is not None,
            "position": leader_position,
        },
        "brokers": sorted(brokers, key=lambda row: row["id"]),
        "insync": insync,
        "bookies": [_bookie_row(b) for b in view["bookies"]],
        "ledgers": {"count": len(view["ledgers"]), "underreplicated": view["underreplicated"]["count"]},
        "queues": merged_queues(answers),
        # None: the leader could not list them now (the page says so rather than show an empty list).
        "dead_tasks": None if dead is None else [_dead_row(t) for t in dead],
        "workers": None if workers is None else [_worker_row(w) for w in workers],
        "shards": [_shard_row(row) for row in shards],
    }


class QueueRates:
    """Per queue, tasks in (any state), done and dead per second over a sliding window. Pure."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._seen: collections.deque[tuple[float, dict]] = collections.deque()

    def add(self, at: float, queues: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
        """Record the depths seen at ``at``; return the rates over the window so far."""
        self._seen.append((at, queues))
        while len(self._seen) > 2 and at - self._seen[0][0] > self.window_s:
            self._seen.popleft()
        first_at, first = self._seen[0]
        span = at - first_at
        rates = {}
        for name, counts in queues.items():
            before = first.get(name, {})
            row = {"in": _per_s(_total(counts) - _total(before), span)}
            for state in RATE_STATES:
                row[state] = _per_s(counts.get(state, 0) - before.get(state, 0), span)
            rates[name] = row
        return rates


def _total(counts: dict[str, int]) -> int:
    # `delayed` is a subset of `waiting`: counted once.
    return sum(n for state, n in counts.items() if state != "delayed")


def _per_s(delta: int, span: float) -> float:
    # Purges make counts fall: a rate is never negative.
    return round(max(0, delta) / span, 2) if span > 0 else 0.0


class ClusterWatcher:
    """A thread refreshing the snapshot every ``interval`` seconds; the HTTP handlers only read it."""

    def __init__(
        self,
        zk: KazooClient,
        cluster: str,
        interval: float = 1.0,
        timeout: float = 1.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.zk = zk
        self.clock = clock
        self.cluster = cluster
        self.interval = interval
        self.timeout = timeout
        self.rates = QueueRates()
        self.failovers: collections.deque[dict] = collections.deque(maxlen=FAILOVERS_KEPT)
        self._last_leaders: dict[int, tuple] = {}  # shard -> (leader, epoch) last seen
        self._latest = json.dumps({"cluster": cluster, "error": "no snapshot yet"}).encode()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dashboard-watcher", daemon=True)

    def start(self) -> None:
        self.refresh()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.interval + self.timeout + 5)

    def latest_json(self) -> bytes:
        """The last snapshot, encoded (a bytes object swapped whole: no lock needed)."""
        return self._latest

    def refresh(self) -> None:
        """Take one snapshot now; a failure is shown on the page as ``error``, the next one may succeed."""
        try:
            snap = cluster_snapshot(self.zk, self.cluster, self.timeout, self.clock)
        except Exception as exc:  # ZooKeeper away, a node half-written: say it, keep polling
            log.debug("snapshot failed", exc_info=True)
            snap = {
                "cluster": self.cluster,
                "taken_at": self.clock.now(),
                "error": f"{type(exc).__name__}: {exc}"[:300],
            }
        else:
            # Counts missing a shard would show as a fall, then a burst: rates only from every shard's.
            answered = all(row["reachable"] for row in snap["shards"])
            snap["rates"] = (
                self.rates.add(self.clock.monotonic(), snap["queues"])
                if snap["leader"] and snap["leader"]["reachable"] and answered
                else {}
            )
            self._note_leaders(snap)
        snap["failovers"] = list(self.failovers)
        self._latest = json.dumps(snap, default=str).encode()

    def _note_leaders(self, snap: dict) -> None:
        """A failover for each shard whose (leader, epoch) changed since the last snapshot that had one."""
        if snap["shards"]:
            seen = {row["shard"]: (row["leader"], row["epoch"]) for row in snap["shards"] if row["leader"]}
        else:
            seen = {0: (snap["leader"]["id"], snap["epoch"])} if snap["leader"] else {}
        for shard, current in seen.items():
            last = self._last_leaders.get(shard)
            if last is not None and current != last:
                failover = {
                    "at": snap["taken_at"],
                    "epoch": current[1],
                    "leader": current[0],
                    "previous": last[0],
                }
                self.failovers.appendleft({**failover, "shard": shard} if snap["shards"] else failover)
            self._last_leaders[shard] = current

    def _run(self) -> None:
        while not self.clock.wait(self._stop, self.interval):
            self.refresh()
