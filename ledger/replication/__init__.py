"""Keeping every ledger at its write quorum (BookKeeper's AutoRecovery): the auditor, under-replication
marks, re-replication of a ledger, and decommissioning a bookie."""
