"""fencepost ledger: fenced, quorum-replicated log ledgers: entry codec, bookies, ledger client, the log."""


class LedgerError(Exception):
    """Root of every error raised by the `ledger` package."""
