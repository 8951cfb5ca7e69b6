"""Pure checks of the log's shape and its replicas: gaps, epochs, and each entry's copies.

No I/O here: :mod:`pipeline.audit_replicas` reads every copy from the bookies
and feeds :func:`copy_findings`; the audit feeds :class:`EpochCheck` with the
entries in log order. Each returns :class:`~pipeline.findings.Finding` records.

Example::

    copies = [Copy("b1", OK, digest_of(data1)), Copy("b2", CORRUPT, None, "bad crc32c digest"), ...]
    copy_findings(7, 41, copies, ack_quorum=2)      # [Finding("corrupt_replica", 7, 41, "b2", ...)]
    check = EpochCheck({7: 3, 9: 4})
    check.entry(7, 0, 3); check.entry(9, 0, 2)      # -> a Finding("epoch_regression", 9, 0, ...)
    gap_findings(7, 0, 9, present=[0, 1, 2, 5, 6, 7, 8, 9])     # entries 3..4 missing
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable

from pipeline.findings import Finding

# What one bookie answered for one entry.
OK, MISSING, CORRUPT, UNKNOWN, UNREACHABLE = "ok", "missing", "corrupt", "unknown", "unreachable"


@dataclass(frozen=True)
class Copy:
    """One bookie's answer for one entry: its ``status``, and for a valid copy a hash of its bytes.

    Example::

        Copy("bookie-1", OK, "5f2c..."); Copy("bookie-2", CORRUPT, None, "bad crc32c digest")
    """

    bookie: str
    status: str
    data_hash: str | None = None
    detail: str = ""


def copy_findings(ledger_id: int, entry_id: int, copies: list[Copy], ack_quorum: int) -> list[Finding]:
    """The problems with one entry's copies on the bookies of its write set.

    A corrupt copy is named; valid copies that differ are named (those outside
    the largest group of identical copies, or all of them on a tie); and an
    entry whose largest group of identical valid copies is smaller than the ack
    quorum is ``under_quorum`` (a missing copy alone is not a finding: an add
    needs only the ack quorum, and a bookie down at the time never got it).
    An entry with no valid copy at all is a gap, reported by :func:`gap_findings`.
    """
    out = [
        Finding("corrupt_replica", ledger_id, entry_id, c.bookie, detail=c.detail or "fails its digest")
        for c in copies
        if c.status == CORRUPT
    ]
    groups = Counter(c.data_hash for c in copies if c.status == OK)
    if not groups:
        return out
    ((best, size),) = groups.most_common(1)
    tie = sum(1 for n in groups.values() if n == size) > 1
    if len(groups) > 1:
        for c in copies:
            if c.status == OK and (tie or c.data_hash != best):
                out.append(
                    Finding(
                        "replica_disagrees",
                        ledger_id,
                        entry_id,
                        c.bookie,
                        detail=f"its copy differs from {sum(groups.values()) - groups[c.data_hash]} "
                        f"other valid copies",
                    )
                )
    if tie or size < ack_quorum:
        states = ", ".join(f"{c.bookie}: {c.status}" for c in copies)
        out.append(
            Finding(
                "under_quorum",
                ledger_id,
                entry_id,
                detail=f"{0 if tie else size} identical valid copies, ack quorum {ack_quorum} ({states})",
            )
        )
    return out


def gap_findings(ledger_id: int, first: int, last: int, present: Iterable[int]) -> list[Finding]:
    """One finding per run of entries ``first..last`` with no valid copy on any bookie."""
    have = set(present)
    out = []
    start = None
    for entry_id in range(first, last + 2):
        missing = entry_id <= last and entry_id not in have
        if missing and start is None:
            start = entry_id
        elif not missing and start is not None:
            span = f"entry {start}" if start == entry_id - 1 else f"entries {start}..{entry_id - 1}"
            out.append(Finding("gap", ledger_id, start, detail=f"{span}: no bookie has a valid copy"))
            start = None
    return out


class EpochCheck:
    """Epochs along the log: ledgers' epochs strictly grow, and no entry's epoch is below an earlier one's.

    ``ledger_epochs`` is each ledger's epoch as the log lists it (empty when
    unknown, reading an export); feed the entries in log order.

    Example::

        check = EpochCheck({7: 3, 9: 4})
        findings = [f for ledger, entry, epoch in entries for f in check.entry(ledger, entry, epoch)]
    """

    def __init__(self, ledger_epochs: dict[int, int]) -> None:
        self.ledger_epochs = ledger_epochs
        self.findings: list[Finding] = []
        self._high = 0  # the highest epoch seen so far (of an entry or a ledger)
        self._high_at = ""
        self._ledger: int | None = None
        for_order: list[tuple[int, int]] = sorted(ledger_epochs.items())
        for (prev, prev_epoch), (ledger_id, epoch) in zip(for_order, for_order[1:]):
            if epoch <= prev_epoch:
                self.findings.append(
                    Finding(
                        "epoch_regression",
                        ledger_id,
                        None,
                        detail=f"ledger {ledger_id} of epoch {epoch} follows ledger {prev} "
                        f"of epoch {prev_epoch} in the log",
                    )
                )

    def entry(self, ledger_id: int, entry_id: int, epoch: int) -> list[Finding]:
        """The findings of one entry (also kept in :attr:`findings`)."""
        out = []
        if ledger_id != self._ledger:
            self._ledger = ledger_id
            ledger_epoch = self.ledger_epochs.get(ledger_id)
            if ledger_epoch is not None and ledger_epoch > self._high:
                self._high, self._high_at = ledger_epoch, f"ledger {ledger_id}"
        if epoch < self._high:
            out.append(
                Finding(
                    "epoch_regression",
                    ledger_id,
                    entry_id,
                    detail=f"an entry of epoch {epoch} after {self._high_at} of epoch {self._high}",
                )
            )
        elif epoch > self._high:
            self._high, self._high_at = epoch, f"entry {ledger_id}:{entry_id}"
        self.findings.extend(out)
        return out
