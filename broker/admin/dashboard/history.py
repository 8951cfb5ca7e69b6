"""The dashboard's charts from the brokers' own numbers: 15 minutes of samples and what they say. Pure.

A sample is what the sampler (:mod:`broker.admin.dashboard.sampler`) read from each shard's
leader at one moment: ``{"t": wall seconds, "shards": [{"shard", "leader", "epoch", "queues",
"commit"}, ...]}``, where ``queues`` is the leader's ``status`` depths by queue and state and
``commit`` its ``commit_histogram`` (entries counted by commit time since its leadership
began); a shard no leader answered for has ``leader`` None and no numbers.

From two samples in a row come the rates of the interval between them (per queue: tasks
submitted, completed, dead, per second) and the commit latency's p50 and p99 (from the
difference of the histograms, as Prometheus's ``histogram_quantile``); from each sample the
queue depth (waiting and running tasks). Depths are counts, not counters: a purge or a result
TTL makes them fall, and the tasks submitted or finished in the same interval are then not
seen (a rate is never negative). An interval some shard's leader did not answer at either
end is a gap in every rate. A leader change is a shard whose answering leader (broker, epoch)
differs from the one last seen.

Example::

    history = MetricsHistory(window_s=900)
    history.add({"t": 100.0, "shards": [{"shard": 0, "leader": 1, "epoch": 3, "queues": {...}, "commit": {...}}]})
    history.charts()     # {"t": [100.0], "queues": [...], "submit": {...}, "leader_changes": [...], ...}
"""

from __future__ import annotations

import collections
from typing import Any

WINDOW_S = 900.0
QUANTILES = {"commit_p50_ms": 0.5, "commit_p99_ms": 0.99}
RATE_STATES = {"complete": "done", "dead": "dead"}


def task_total(counts: dict[str, int]) -> int:
    """Every task of a queue whatever its state (``delayed`` is a subset of ``waiting``: counted once)."""
    return sum(n for state, n in counts.items() if state != "delayed")


def depth(counts: dict[str, int]) -> int:
    """Tasks of a queue not finished yet: waiting (delayed ones included) and running."""
    return counts.get("waiting", 0) + counts.get("running", 0)


def queue_rates(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], span_s: float
) -> dict[str, dict[str, float]]:
    """Per queue of ``after``, tasks submitted, completed and dead per second from ``before`` to ``after``."""
    if span_s <= 0:
        return {}
    out = {}
    for name, counts in after.items():
        was = before.get(name, {})
        row = {"submit": _per_s(task_total(counts) - task_total(was), span_s)}
        for rate, state in RATE_STATES.items():
            row[rate] = _per_s(counts.get(state, 0) - was.get(state, 0), span_s)
        out[name] = row
    return out


def _per_s(delta: int, span_s: float) -> float:
    return round(max(0, delta) / span_s, 3)


def histogram_delta(before: dict | None, after: dict | None) -> list[int] | None:
    """Entries per bucket between two ``commit_histogram`` readings; None unless both are given.

    Counts that fell (or bounds that differ) mean another leadership counted ``after`` from zero
    within the interval: its counts are the interval's, as for a Prometheus counter reset."""
    if not before or not after:
        return None
    counts = list(after["counts"])
    if before["bounds_ms"] != after["bounds_ms"] or len(before["counts"]) != len(counts):
        return counts
    delta = [a - b for a, b in zip(counts, before["counts"])]
    return counts if any(d < 0 for d in delta) else delta


def histogram_quantile(bounds: list[float], counts: list[int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``counts`` per bucket of upper ``bounds`` (one more: beyond the last),
    interpolated linearly within its bucket; the last bound if it falls beyond; None without counts."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            if index >= len(bounds):
                return float(bounds[-1])
            low = 0.0 if index == 0 else float(bounds[index - 1])
            return round(low + (float(bounds[index]) - low) * (rank - seen) / count, 3)
        seen += count
    return float(bounds[-1])


class LeaderChanges:
    """Each shard's answering leader as last seen; :meth:`see` names the changes a sample shows. Pure.

    Example::

        changes = LeaderChanges()
        changes.see(sample_with_broker_1)     # [] (the first leader seen is no change)
        changes.see(sample_with_broker_2)     # [{"t": .., "shard": 0, "leader": 2, "epoch": 4, "previous": 1}]
    """

    def __init__(self) -> None:
        self._known: dict[int, tuple[Any, Any]] = {}

    def see(self, sample: dict) -> list[dict]:
        found = []
        for shard in sample["shards"]:
            if shard.get("leader") is None:
                continue  # no leader answered: the change shows once one does
            current = (shard["leader"], shard.get("epoch"))
            last = self._known.get(shard["shard"])
            if last is not None and last != current:
                found.append(
                    {
                        "t": sample["t"],
                        "shard": shard["shard"],
                        "leader": current[0],
                        "epoch": current[1],
                        "previous": last[0],
                    }
                )
            self._known[shard["shard"]] = current
        return found


def _answered(sample: dict) -> bool:
    return bool(sample["shards"]) and all(s.get("queues") is not None for s in sample["shards"])


def _merged_queues(sample: dict) -> dict[str, dict[str, int]]:
    merged: dict[str, dict[str, int]] = {}
    for shard in sample["shards"]:
        for name, counts in (shard.get("queues") or {}).items():
            row = merged.setdefault(name, {})
            for state, n in counts.items():
                row[state] = row.get(state, 0) + n
    return merged


def _commit_quantiles(before: dict, after: dict) -> dict[str, float | None]:
    """The commit latency quantiles of the interval, the entries of every shard's leader together."""
    earlier = {s["shard"]: s.get("commit") for s in before["shards"]}
    bounds, summed = None, None
    for shard in after["shards"]:
        delta = histogram_delta(earlier.get(shard["shard"]), shard.get("commit"))
        if delta is None:
            continue
        if summed is None:
            bounds, summed = shard["commit"]["bounds_ms"], delta
        elif shard["commit"]["bounds_ms"] == bounds:
            summed = [a + b for a, b in zip(summed, delta)]
    if summed is None:
        return {name: None for name in QUANTILES}
    return {name: histogram_quantile(bounds, summed, q) for name, q in QUANTILES.items()}


class MetricsHistory:
    """The samples of the last ``window_s`` seconds and the leader changes among them (see the module)."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: collections.deque[dict] = collections.deque()
        self._changes: collections.deque[dict] = collections.deque()
        self._leaders = LeaderChanges()

    def add(self, sample: dict) -> None:
        """Keep ``sample`` (samples come in time order); forget what is older than the window."""
        self._samples.append(sample)
        self._changes.extend(self._leaders.see(sample))
        horizon = sample["t"] - self.window_s
        while self._samples and self._samples[0]["t"] < horizon:
            self._samples.popleft()
        while self._changes and self._changes[0]["t"] < horizon:
            self._changes.popleft()

    def charts(self) -> dict:
        """The series the page draws, one value per sample (None: a gap; rates and latency of the
        interval ending at that sample), and the leader changes of the window."""
        samples = list(self._samples)
        merged = [_merged_queues(s) if _answered(s) else None for s in samples]
        names = sorted({name for queues in merged if queues for name in queues})
        doc: dict = {
            "window_s": self.window_s,
            "t": [s["t"] for s in samples],
            "queues": names,
            # Shards of the newest sample that had any: leader changes name theirs only with several.
            "shards": next((len(s["shards"]) for s in reversed(samples) if s["shards"]), 0),
            "depth": {
                name: [None if q is None else depth(q.get(name, {})) for q in merged] for name in names
            },
            **{rate: {name: [] for name in names} for rate in ("submit", *RATE_STATES)},
            **{name: [] for name in QUANTILES},
            "leader_changes": list(self._changes),
        }
        for index, sample in enumerate(samples):
            before = samples[index - 1] if index else None
            rates = {}
            if before is not None and merged[index] is not None and merged[index - 1] is not None:
                rates = queue_rates(merged[index - 1], merged[index], sample["t"] - before["t"])
            for rate in ("submit", *RATE_STATES):
                for name in names:
                    doc[rate][name].append(rates[name][rate] if name in rates else None)
            quantiles = _commit_quantiles(before, sample) if before is not None else {}
            for name in QUANTILES:
                doc[name].append(quantiles.get(name))
        return doc
