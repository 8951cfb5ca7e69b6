"""The new epoch's ledger, created while the takeover recovers and catches up.

Creating a ledger is a handful of ZooKeeper round trips (the live bookies, the
sequential node, the CAS that writes its id). None of them depends on the
previous ledgers being closed or on the store being caught up, only on the epoch
claimed, so a takeover starts it right after its claim and collects the writer
when it is ready to append it to the log: during a handover those round trips
then overlap the recovery's instead of adding to the time without a leader.

Ordering still holds: the ledger is created after the claim, so any ledger a
stale leader manages to put in the log was created before it (a stale leader's
later log change fails its epoch check), and the log's ledger ids keep growing.
A ledger created for a takeover that fails before appending it is closed (empty)
in the background, so that retention can delete it like any ledger left out of
the log.

Example::

    ahead = LedgerAhead(ledgers, claim.epoch)   # right after claim_epoch
    ...                                          # recover, catch up
    writer = ahead.writer()                      # raises what the creation raised
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future

from kazoo.exceptions import KazooException

from ledger import LedgerError
from ledger.client.facade import LedgerClient
from ledger.client.writer import LedgerWriter

log = logging.getLogger(__name__)

# Bounds the close of an unused ledger (a background thread; nothing waits for it).
DISCARD_CLOSE_S = 5.0


class LedgerAhead:
    """Creates the ledger of ``epoch`` on its own thread; :meth:`writer` waits for it."""

    def __init__(self, ledgers: LedgerClient, epoch: int) -> None:
        self._ledgers, self._epoch = ledgers, epoch
        self._future: Future[LedgerWriter] = Future()
        self._taken = False
        threading.Thread(target=self._create, name=f"create-ledger-epoch-{epoch}", daemon=True).start()

    def _create(self) -> None:
        try:
            self._future.set_result(self._ledgers.create(self._epoch))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits, raised there
            self._future.set_exception(exc)

    def writer(self) -> LedgerWriter:
        """The created ledger's writer (the creation's exception if it failed); the caller owns it."""
        self._taken = True
        return self._future.result()

    def discard(self) -> None:
        """The takeover ended before :meth:`writer` was taken: close the ledger, once created, empty."""
        if not self._taken:
            self._taken = True
            self._future.add_done_callback(_close_unused)


def _close_unused(future: Future) -> None:
    if future.exception() is not None:
        return
    writer = future.result()

    def close() -> None:
        try:
            writer.close(timeout=DISCARD_CLOSE_S)
            log.info("closed ledger %d, created for a takeover that did not serve", writer.ledger_id)
        except (LedgerError, KazooException) as exc:
            log.warning("ledger %d, created for a takeover that did not serve: %s", writer.ledger_id, exc)

    threading.Thread(target=close, name=f"discard-ledger-{writer.ledger_id}", daemon=True).start()
