"""Helpers of the bookie journal tests: waiting for a checkpoint, tearing a journal file's tail."""

from __future__ import annotations

import os

from ledger.bookie.journal import journal_files
from tests.support.harness import wait_for


def wait_checkpointed(client, timeout: float = 10.0) -> dict:
    """Wait until the bookie behind ``client`` has checkpointed its whole journal; its stats."""
    stats = {}

    def caught_up() -> bool:
        stats.update(client.call("stats"))
        return stats["checkpoint_at"] == stats["journal_at"]

    wait_for(caught_up, timeout, "a checkpoint covering the whole journal")
    return stats


def newest_journal_file(journal_dir) -> str:
    files = journal_files(str(journal_dir))
    return files[max(files)]


def tear_tail(path: str, end: int, keep: int) -> None:
    """Zero a journal file from ``end - keep`` to ``end``: the last group's sync never finished."""
    with open(path, "r+b") as fh:
        fh.seek(end - keep)
        fh.write(bytes(keep))
        fh.flush()
        os.fsync(fh.fileno())
