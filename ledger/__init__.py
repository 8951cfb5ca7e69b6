"""fencepost ledger: fenced, quorum-replicated log ledgers.

The top level is pure or ZooKeeper only: the entry codec, quorum bookkeeping, ledger metadata,
placement and the log (the ordered list of ledgers). ``client/`` is what a broker uses, ``bookie/``
the bookie process, ``replication/`` the auditor, re-replication and decommissioning.
"""


class LedgerError(Exception):
    """Root of every error raised by the `ledger` package."""
