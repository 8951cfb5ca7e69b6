"""The errors a request to a bookie ends in.

:class:`BookieUnavailable` when the bookie does not answer within the request's
timeout, cannot be sent to, or the pool is closed. An error reply becomes a
:class:`BookieError` (a wire error that is also a ledger error) through
``error_for``, which picks the subclass declaring the reply's code:
:class:`LedgerFencedError` for ``fenced`` (the writer must stop),
:class:`NoSuchEntry` for ``no_entry``, and :class:`Unvouched` for ``unknown``
(the bookie cannot vouch for that ledger: count it as a bookie that is down,
never as "no such entry").
"""

from __future__ import annotations

from election.wire import RemoteError
from election.wire.codes import E_FENCED, E_NO_ENTRY, E_UNKNOWN
from ledger import LedgerError


class BookieUnavailable(LedgerError):
    """A bookie did not answer in time, could not be sent to, or the pool is closed."""

    def __init__(self, address: str, message: str) -> None:
        super().__init__(f"bookie {address} unavailable: {message}")
        self.address = address


class BookieError(RemoteError, LedgerError):
    """An error reply from a bookie: a wire error that is also a ledger error."""


class LedgerFencedError(BookieError, code=E_FENCED):
    """The ledger is fenced: its writer must stop (another client recovers or closed it)."""

    def __init__(self, code: str = E_FENCED, message: str = "ledger is fenced") -> None:
        super().__init__(code, message)


class NoSuchEntry(BookieError, code=E_NO_ENTRY):
    """The bookie holds no copy of the requested entry."""

    def __init__(self, code: str = E_NO_ENTRY, message: str = "no such entry") -> None:
        super().__init__(code, message)


class Unvouched(BookieError, code=E_UNKNOWN):
    """The bookie cannot vouch for the ledger (its copy was damaged or lost): it does not count."""

    def __init__(
        self, code: str = E_UNKNOWN, message: str = "the bookie cannot vouch for this ledger"
    ) -> None:
        super().__init__(code, message)
