"""Which entries of a ledger are committed: ack bookkeeping for in-order quorum completion.

Pure logic, no I/O: the :class:`~ledger.client.writer.LedgerWriter` feeds it the
bookies' replies and learns which entries just became complete. Members are the
slots of the ensemble; when the bookie of a slot is replaced (an ensemble
change), :meth:`QuorumTracker.forget_member` drops what the old bookie did for
the entries of the new fragment, so each entry's ack quorum is counted against
its own fragment's ensemble. It also follows, per member, up to which entry the
member acked every entry since it joined (:meth:`QuorumTracker.first_unacked`):
an entry commits on an ack quorum, so a member that fell silent may lack
committed entries, and the writer must name them when it swaps the member out.
"""

from __future__ import annotations


class QuorumTracker:
    """Pure ack bookkeeping for in-order quorum completion.

    Members are numbered ``0 .. write_quorum-1``. Entries must be registered in
    order with :meth:`add`. Acks and failures are bit masks per pending entry
    (plain ints), and :meth:`ack_range` / :meth:`fail_range` record a whole
    ``add_batch`` reply at once. Example::

        t = QuorumTracker(write_quorum=3, ack_quorum=2)
        t.add(0); t.add(1)
        t.ack(1, 0); t.ack(1, 2)   # -> []   (entry 0 is not complete yet)
        t.ack(0, 1); t.ack(0, 2)   # -> [0, 1]
        t.lac                      # 1
    """

    def __init__(self, write_quorum: int, ack_quorum: int, lac: int = -1) -> None:
        if not 1 <= ack_quorum <= write_quorum:
            raise ValueError(f"need 1 <= ack_quorum <= write_quorum, got {ack_quorum}/{write_quorum}")
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self.lac = lac
        self._next = lac + 1
        self._acks: dict[int, int] = {}  # pending entry -> mask of the members that acked it
        self._fails: dict[int, int] = {}  # pending entry -> mask of the members that failed it (if any did)
        # Per member: every entry up to here acked since it joined, and acked runs past a gap (replies
        # out of order, e.g. a replacement's re-send answered after a later flush), ascending.
        self._through = [lac] * write_quorum
        self._ahead: list[list[tuple[int, int]]] = [[] for _ in range(write_quorum)]

    @property
    def pending(self) -> list[int]:
        """Entries added but neither complete nor abandoned, ascending."""
        return sorted(self._acks)

    def add(self, entry_id: int) -> None:
        if entry_id != self._next:
            raise ValueError(f"entry {entry_id} added out of order (expected {self._next})")
        self._next = entry_id + 1
        self._acks[entry_id] = 0

    def add_run(self, first: int, count: int) -> None:
        """Register entries ``first .. first+count-1`` at once (the writer's flush)."""
        if first != self._next:
            raise ValueError(f"entry {first} added out of order (expected {self._next})")
        self._next = first + count
        self._acks.update(dict.fromkeys(range(first, first + count), 0))

    def ack(self, entry_id: int, member: int) -> list[int]:
        """Record an ack; return the entries that became complete, in order."""
        return list(self.ack_range(entry_id, 1, member))

    def ack_range(self, first: int, count: int, member: int) -> range:
        """Record ``member``'s acks of entries ``first .. first+count-1``; return the entries that became complete.

        Entries already complete or abandoned are ignored, and so is the ack of
        an entry that ``member`` failed earlier (for the quorum: the entries still
        count as held by ``member`` in :meth:`first_unacked`).
        """
        self._held(member, first, first + count - 1)
        bit = 1 << member
        acks, fails = self._acks, self._fails
        get = acks.get
        for e in range(first, first + count):
            m = get(e)
            if m is not None and not (fails and fails.get(e, 0) & bit):
                acks[e] = m | bit
        start = lac = self.lac
        quorum = self.ack_quorum
        while True:
            m = get(lac + 1)
            if m is None or m.bit_count() < quorum:
                break
            lac += 1
            del acks[lac]
            if fails:
                fails.pop(lac, None)
        self.lac = lac
        return range(start + 1, lac + 1)

    def _held(self, member: int, first: int, last: int) -> None:
        """``member`` stored ``first .. last``: move its acked-through mark on, absorbing runs it reaches."""
        through = self._through[member]
        if last <= through:
            return
        ahead = self._ahead[member]
        if first > through + 1:
            ahead.append((first, last))
            ahead.sort()
            return
        through = last
        while ahead and ahead[0][0] <= through + 1:
            through = max(through, ahead.pop(0)[1])
        self._through[member] = through

    def first_unacked(self, member: int) -> int:
        """The lowest entry since ``member`` joined (:meth:`join`) that it has not acknowledged.

        Every entry before it was acked by ``member``, committed or not; entries
        after it may have been (replies out of order). Example::

            t = QuorumTracker(3, 2); t.add(0); t.add(1); t.add(2)
            t.ack(0, 0); t.ack(0, 1); t.ack(1, 1); t.ack(1, 2); t.ack(2, 0)
            t.first_unacked(0), t.first_unacked(1), t.first_unacked(2)   # (1, 2, 0)
        """
        return self._through[member] + 1

    def join(self, member: int, first: int) -> None:
        """A new bookie takes slot ``member`` from entry ``first`` on: it owes nothing before it, acked nothing yet.

        Call with :meth:`forget_member` when the slot's bookie is replaced.
        """
        self._through[member] = first - 1
        self._ahead[member] = []

    def fail(self, entry_id: int, member: int) -> bool:
        """Record that ``member`` will not ack ``entry_id``; True if it can no longer complete."""
        return self.fail_range(entry_id, 1, member) is not None

    def fail_range(self, first: int, count: int, member: int) -> int | None:
        """Record that ``member`` will not ack ``first .. first+count-1``; return the lowest of them that can
        no longer complete, or None. A member's failure of an entry it acked already changes nothing."""
        bit = 1 << member
        acks, fails = self._acks, self._fails
        most = self.write_quorum - self.ack_quorum  # failures an entry survives
        lost = None
        for e in range(first, first + count):
            m = acks.get(e)
            if m is None or m & bit:
                continue  # complete, abandoned, or acked by this member
            f = fails.get(e, 0) | bit
            fails[e] = f
            if lost is None and f.bit_count() > most:
                lost = e
        return lost

    def failed_members(self, entry_id: int) -> list[int]:
        """The members that failed a pending entry, ascending."""
        f = self._fails.get(entry_id, 0)
        return [m for m in range(self.write_quorum) if f >> m & 1]

    def forget_member(self, member: int, first: int) -> None:
        """Forget ``member``'s acks and failures of the pending entries ``>= first``.

        Used when the bookie in slot ``member`` is swapped out (an ensemble
        change): entries from ``first`` on belong to the new fragment, where only
        the replacement's acks count in that slot. Forgetting acks never
        completes an entry. Example::

            t = QuorumTracker(3, 2); t.add(0); t.add(1)
            t.ack(1, 0)                 # the bookie in slot 0 acked entry 1, then failed
            t.forget_member(0, 0)       # entries 0.. move to a new fragment
            t.ack(1, 1)                 # -> [] : slot 0's old ack no longer counts
        """
        keep = ~(1 << member)
        acks, fails = self._acks, self._fails
        for e in acks:
            if e >= first:
                acks[e] &= keep
                if e in fails:
                    fails[e] &= keep
                    if not fails[e]:
                        del fails[e]

    def abandon_from(self, entry_id: int) -> list[int]:
        """Drop every pending entry ``>= entry_id``; return them in order."""
        dropped = sorted(e for e in self._acks if e >= entry_id)
        for e in dropped:
            del self._acks[e]
            self._fails.pop(e, None)
        return dropped
