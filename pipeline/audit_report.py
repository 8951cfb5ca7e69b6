"""What an audit checked and found: one :class:`ShardAudit` per shard, in an :class:`AuditReport`.

:mod:`pipeline.audit` fills them; :meth:`AuditReport.summary` is what ``fencepost audit
--json`` prints. A shard's ``replay`` is a :class:`~pipeline.replay.ReplayResult` when the
history was replayed in one piece (an export) and a
:class:`~pipeline.audit_ranges.ShardReplay` when it was replayed range by range (a cluster).

Example::

    report.findings                 # [] when the history is clean; each finding names its shard
    report.summary()["shards"][0]["ranges"]
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.audit_ranges import ShardReplay
from pipeline.findings import Finding, sort_key
from pipeline.replay import ReplayResult
from pipeline.rows import format_position


def replay_summary(results: list[ReplayResult | ShardReplay]) -> dict | None:
    """The replays of one or more shards in one summary (``from``/``to`` only for one replay)."""
    if not results:
        return None
    one = results[0] if len(results) == 1 else None
    events, seconds = sum(r.events for r in results), sum(r.seconds for r in results)
    return {
        "from": None if one is None or one.start is None else format_position(one.start),
        "to": None if one is None or one.last is None else format_position(one.last),
        "entries": sum(r.entries for r in results),
        "events": events,
        "seconds": round(seconds, 3),
        "events_per_s": round(events / seconds) if seconds else None,
        "grants": sum(r.grants if isinstance(r.grants, int) else len(r.grants) for r in results),
    }


def digest_counts(results: list[ReplayResult | ShardReplay]) -> dict:
    checks = [c for r in results for c in r.digest_checks]
    return {
        "compared": sum(1 for c in checks if c.compared),
        "not_compared": sum(1 for c in checks if not c.compared),
    }


@dataclass
class ShardAudit:
    """What an audit checked of one shard: its ledgers and entries, its replay and its brokers.

    Example::

        report.shards[2].replay.last, report.shards[2].summary()["state_digests"]
    """

    shard: int
    ledgers: int = 0
    entries: int = 0
    replay: ReplayResult | ShardReplay | None = None
    brokers: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        replays = [self.replay] if self.replay is not None else []
        return {
            "shard": self.shard,
            "ledgers": self.ledgers,
            "entries": self.entries,
            "replay": replay_summary(replays),
            "state_digests": digest_counts(replays),
            "brokers": sum(1 for b in self.brokers if b.get("compared")),
            "ranges": list(getattr(self.replay, "ranges", None) or []),
            "tasks_checked": getattr(self.replay, "tasks_checked", "all"),
        }


@dataclass
class AuditReport:
    """What an audit checked and found, over every shard (``shards``, one :class:`ShardAudit` each).

    Example::

        report.findings                 # [] when the history is clean; each finding names its shard
        report.summary()                # JSON-ready counts, timings and findings
    """

    source: str
    shards: list[ShardAudit]
    findings: list[Finding] = field(default_factory=list)
    copies: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    engine: str = "spark"  # or "pyarrow": run in this process (a small history, or an export)

    @property
    def ledgers(self) -> int:
        return sum(s.ledgers for s in self.shards)

    @property
    def entries(self) -> int:
        return sum(s.entries for s in self.shards)

    @property
    def brokers(self) -> list[dict]:
        return [b for s in self.shards for b in s.brokers]

    @property
    def replay(self) -> ReplayResult | ShardReplay | None:
        """The replay of a 1-shard audit (None with several shards: see each of :attr:`shards`)."""
        return self.shards[0].replay if len(self.shards) == 1 else None

    def summary(self) -> dict:
        replays = [s.replay for s in self.shards if s.replay is not None]
        return {
            "clean": not self.findings,
            "source": self.source,
            "engine": self.engine,
            "ledgers": self.ledgers,
            "entries": self.entries,
            "copies": dict(self.copies),
            "replay": replay_summary(replays),
            "state_digests": digest_counts(replays),
            "brokers": self.brokers,
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "shards": [s.summary() for s in self.shards],
            "findings": [f.as_dict() for f in sorted(self.findings, key=sort_key)],
        }


def compare_brokers(audit: ShardAudit) -> list[Finding]:
    result = audit.replay
    findings = []
    for row in audit.brokers:
        position = tuple(row["position"]) if row["position"] else None
        mine = result.digests_at.get(position) if result is not None and position else None
        row["compared"] = mine is not None
        if mine is not None and mine != row["digest"]:
            findings.append(
                Finding(
                    "broker_digest_mismatch",
                    position[0],
                    position[1],
                    detail=f"broker {row['id']} reports {row['digest']}, the replayed state {mine}",
                )
            )
    return findings
