"""Audit findings: one structured record per problem found in the history, and how they are shown.

A finding names what is wrong (``kind``) and where: the position (``ledger``,
``entry``) in the log of its ``shard`` (each shard its own log and state machine),
the bookie holding a bad copy, the task, and a sentence of ``detail``. The kinds are listed in :data:`KINDS` (docs/pipeline.md, "Audit").
An audit with no finding exits 0, with any 1.

Example::

    found = [Finding("corrupt_replica", ledger=7, entry=41, bookie="bookie-2", detail="bad crc32c digest", shard=0)]
    print(findings_table(found))
    print(findings_table(found, with_shard=True))   # a cluster of several shards: a SHARD column
    exit_code(found)            # 1
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

# kind -> what it means (the docs' table says the same).
KINDS = {
    "gap": "a ledger has no readable copy of an entry before its last one",
    "epoch_regression": "an entry or ledger of an epoch lower than one earlier in the log",
    "under_quorum": "fewer valid copies of an entry than the ledger's ack quorum",
    "corrupt_replica": "a bookie's copy of an entry fails its digest (or is another entry)",
    "replica_disagrees": "a bookie's valid copy differs byte for byte from the other copies",
    "stale_completion": "a task was completed or failed by an attempt that was not its current one",
    "finished_twice": "a task reached a final state twice",
    "attempts_exceeded": "a task was leased more times than its max_attempts",
    "attempt_skipped": "a lease's attempt is not the task's previous attempt plus one",
    "expired_after_start": "a task was expired although it had started (only a task never leased expires)",
    "overflow_not_waiting": "a queue's overflow dropped or dead-lettered a task that was not waiting",
    "digest_mismatch": "the replayed state differs from a StateDigest entry at its position",
    "broker_digest_mismatch": "the replayed state differs from a live broker's digest at its position",
    "replay_failed": "the history could not be replayed past an entry",
}


@dataclass(frozen=True)
class Finding:
    """One problem. Unused fields are None (``shard`` too, until the audit says whose log it is in).

    Example::

        Finding("stale_completion", ledger=7, entry=12, task_id="0a1b...",
                detail="TaskCompleted by attempt 1 accepted while attempt 2 was current", shard=2)
    """

    kind: str
    ledger: int | None = None
    entry: int | None = None
    bookie: str | None = None
    task_id: str | None = None
    detail: str = ""
    shard: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def exit_code(findings: Iterable[Finding]) -> int:
    """0 when there is nothing to report, 1 otherwise."""
    return 1 if any(True for _ in findings) else 0


def sort_key(finding: Finding) -> tuple:
    """Findings by shard, in log order within it, then by kind and bookie."""
    return (
        finding.shard if finding.shard is not None else -1,
        finding.ledger if finding.ledger is not None else -1,
        finding.entry if finding.entry is not None else -1,
        finding.kind,
        finding.bookie or "",
        finding.task_id or "",
    )


def findings_table(findings: list[Finding], with_shard: bool = False) -> str:
    """The findings as a text table, one line each, by shard and in log order (``with_shard``: a SHARD
    column, for a cluster of several shards)."""
    header = ("KIND", *(("SHARD",) if with_shard else ()), "POSITION", "BOOKIE", "TASK", "DETAIL")
    rows = [header]
    for f in sorted(findings, key=sort_key):
        position = "-" if f.ledger is None else f"{f.ledger}:{'-' if f.entry is None else f.entry}"
        shard = (("-" if f.shard is None else str(f.shard)),) if with_shard else ()
        rows.append((f.kind, *shard, position, f.bookie or "-", f.task_id or "-", f.detail))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows)
