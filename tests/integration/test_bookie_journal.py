"""Real bookie processes and their journal: SIGKILL after acks, a journal on its own directory, a torn tail."""

from __future__ import annotations

import pytest

from tests.support.bookie_client import entry
from tests.support.journal import newest_journal_file, tear_tail

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# No checkpoint during the test: everything acknowledged is in the journal only (the store is not synced).
NO_CHECKPOINT = ["--journal-checkpoint-s", "3600"]


def fill(c, ledgers: int = 3, runs: int = 4, size: int = 50) -> None:
    for ledger in range(1, ledgers + 1):
        for r in range(runs):
            first = r * size
            batch = [entry(ledger, i, lac=i - 1) for i in range(first, first + size)]
            assert c.call("add_batch", ledger=ledger, first=first, entries=batch)["ok"]


def test_sigkill_right_after_acks_loses_no_add_and_no_fence(cluster, procs, client_for, tmp_path):
    journal_dir = tmp_path / "other-disk" / "journal"
    bookie = procs.start_bookie(cluster, extra=[*NO_CHECKPOINT, "--journal-dir", str(journal_dir)])
    c = client_for(bookie.address)
    fill(c)
    assert c.call("fence", ledger=2)["fenced"] is True
    stats = c.call("stats")
    assert stats["journal_syncs"] >= 13 and stats["journal_records"] == 13 and stats["checkpoints"] == 0
    bookie.kill()
    assert newest_journal_file(journal_dir)  # the journal went to --journal-dir
    assert not (bookie.data_dir / "journal").exists()

    restarted = procs.restart(bookie)
    c = client_for(restarted.address)
    assert "replayed 13 journal records (600 entries)" in restarted.output()
    for ledger in (1, 2, 3):
        assert c.call("read_lac", ledger=ledger)["last_entry"] == 199
        for i in (0, 99, 199):
            assert c.call("read", ledger=ledger, entry=i)["data"] == entry(ledger, i, lac=i - 1)
    assert c.call("read_lac", ledger=2)["fenced"] is True
    late = c.call("add", ledger=2, entry=200, data=entry(2, 200, lac=199))
    assert late["ok"] is False and late["error"] == "fenced"
    assert c.call("stats")["replayed_records"] == 13

    # Started without --journal-dir, the bookie finds no journal next to its unclean store: refused.
    restarted.kill()
    args = [a for a in bookie.args if a not in ("--journal-dir", str(journal_dir))]
    again = procs.start("bookie-again", args, data_dir=bookie.data_dir)
    assert again.wait(60) == 1
    assert "its journal is missing from" in again.output() and "Traceback" not in again.output()


def test_a_torn_journal_tail_after_sigkill_is_dropped(cluster, procs, client_for):
    bookie = procs.start_bookie(cluster, extra=NO_CHECKPOINT)
    c = client_for(bookie.address)
    fill(c, ledgers=1, runs=2)
    end = c.call("stats")["journal_at"][1]
    bookie.kill()
    # The last group (entries 50-99) as if its sync had not finished: its end never reached the disk.
    tear_tail(newest_journal_file(bookie.data_dir / "journal"), end, 1024)

    restarted = procs.restart(bookie)
    output = restarted.output()
    assert "ends in a torn group" in output and "dropped" in output and "Traceback" not in output
    c = client_for(restarted.address)
    assert c.call("read", ledger=1, entry=49)["ok"]
    # The store was never synced but the killed process's writes were in the page cache: the torn
    # group's entries are there, they were just never acknowledged. Adds go on after the restart.
    assert c.call("add", ledger=1, entry=100, data=entry(1, 100, lac=99))["ok"]
    assert restarted.terminate() == 0
    assert "ends in a torn group" not in procs.restart(restarted).output()  # the checkpoint dropped it
