"""A bookie's checkpoints: the entry store synced, the journal before it no longer needed.

Between checkpoints the store is written without sync (the journal makes adds durable).
A checkpoint takes a journal position ``P`` handed over by the serving loop once the store
holds every record before ``P`` (adds are stored before they are journaled, a fence or a
delete just after: the loop offers a position only after the store write), syncs the store
(one ``env.sync``: the transactions completed before it are on disk), records ``P`` in the
journal's ``JOURNAL`` file (atomically) and deletes the journal files wholly before ``P``.
Replay after a crash starts at the last recorded ``P``.

It runs on a thread of its own so that a sync of many dirty pages does not stall the
serving loop (LMDB allows a sync beside the writer). The loop asks for one every
``interval_s`` and whenever the journal rolled to a new file (:meth:`Checkpointer.offer`);
an orderly close makes a last one on the loop's thread (:meth:`Checkpointer.close`).
A failed checkpoint (a full disk...) is logged and tried again at the next offer: the
journal keeps everything since the last good one.

Example::

    checkpoints = Checkpointer(store, journal_dir, instance_id, bookie_id, interval_s=5.0)
    checkpoints.start()
    checkpoints.offer(journal.position(), now)   # after each group commit: cheap unless due
    checkpoints.close(journal.position())        # at an orderly close: synchronous
"""

from __future__ import annotations

import logging
import threading

from ledger.bookie import crash_points
from ledger.bookie.journal import Position, delete_before, write_state
from ledger.bookie.store import BookieStore

log = logging.getLogger(__name__)


class Checkpointer:
    """Checkpoints on a background thread; ``done``, ``failed`` and ``deleted_files`` count them."""

    def __init__(
        self,
        store: BookieStore,
        directory: str,
        instance_id: str,
        bookie_id: str,
        interval_s: float,
        start: Position,
        now: float,
    ) -> None:
        self._store = store
        self._directory = directory
        self._instance_id = instance_id
        self._bookie_id = bookie_id
        self.interval_s = interval_s
        self.done = self.failed = self.deleted_files = 0
        self.checkpoint = start  # the last position recorded
        self._asked = start
        self._asked_at = now
        self._wanted: Position | None = None
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="bookie-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def offer(self, position: Position, now: float) -> None:
        """Ask for a checkpoint at ``position`` if one is due (time, or a new journal file)."""
        if position == self._asked:
            return
        if now - self._asked_at < self.interval_s and position[0] == self._asked[0]:
            return
        with self._cond:
            if self._wanted is not None:
                return  # one is running or waiting: the next offer takes the newer position
            self._wanted = position
            self._cond.notify()
        self._asked, self._asked_at = position, now

    def close(self, position: Position | None) -> None:
        """Stop the thread; with ``position``, checkpoint there first (the loop no longer writes)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()
        if position is not None and position != self.checkpoint:
            self._checkpoint(position)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._wanted is None and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                position = self._wanted
            try:
                self._checkpoint(position)
            finally:
                with self._cond:
                    self._wanted = None

    def _checkpoint(self, position: Position) -> None:
        try:
            self._store.flush()
            if crash_points.CRASH is not None:
                crash_points.CRASH.reached(crash_points.DURING_CHECKPOINT)  # replay must redo what is stored
            write_state(self._directory, self._instance_id, self._bookie_id, position)
        except Exception as exc:  # the journal still holds it all: the next checkpoint covers it
            self.failed += 1
            log.warning("bookie %s: checkpoint at journal %s failed: %s", self._bookie_id, position, exc)
            return
        self.checkpoint = position
        self.done += 1
        try:
            self.deleted_files += delete_before(self._directory, position[0])
        except OSError as exc:
            log.warning("bookie %s: old journal files not deleted: %s", self._bookie_id, exc)
