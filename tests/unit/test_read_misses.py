"""A reader's skipped copies are logged one line per ledger and bookie, with a count."""

from __future__ import annotations

import logging

import pytest

from ledger.client.read_misses import MISSING, UNAVAILABLE, UNKNOWN, ReadMisses
from tests.support.clock import FakeClock

LOGGER = "ledger.client.reader"


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_run_of_284_missing_entries_is_two_lines_not_284(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock(monotonic=0.0)
    misses = ReadMisses(ledger_id=0, clock=clock)
    for entry_id in range(100, 384):
        misses.note("bookie-a", MISSING, entry_id)
    misses.report()  # within the interval: nothing more yet
    assert len(_lines(caplog)) == 1
    assert "ledger 0 entry 100: bookie bookie-a has no copy" in _lines(caplog)[0]
    clock.advance(10.0)
    misses.report()
    lines = _lines(caplog)
    assert len(lines) == 2
    assert "bookie bookie-a had no copy of 283 more entries (101..383)" in lines[1]
    clock.advance(10.0)
    misses.report()
    assert len(_lines(caplog)) == 2  # nothing left to say


def test_bookies_and_kinds_are_counted_apart(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    misses = ReadMisses(ledger_id=3, clock=FakeClock(monotonic=0.0))
    for entry_id in range(5):
        misses.note("bookie-a", MISSING, entry_id)
        misses.note("bookie-b", UNKNOWN, entry_id, "limbo after an unclean stop")
        misses.note("bookie-c", UNAVAILABLE, entry_id, "timed out")
    misses.report(force=True)
    lines = _lines(caplog)
    assert len(lines) == 6 and misses.lines == 6
    assert any("bookie-b could not vouch for 4 more entries (1..4), last: limbo" in line for line in lines)
    assert any("bookie-c did not answer for 4 more entries (1..4), last: timed out" in line for line in lines)


@pytest.mark.parametrize("kind", [MISSING, UNKNOWN, UNAVAILABLE])
def test_a_single_miss_is_one_line(caplog, kind):
    caplog.set_level(logging.INFO, logger=LOGGER)
    misses = ReadMisses(ledger_id=1, clock=FakeClock(monotonic=0.0))
    misses.note("bookie-a", kind, 7)
    misses.report(force=True)
    assert len(_lines(caplog)) == 1 and "entry 7" in _lines(caplog)[0]


def test_after_a_report_the_next_miss_counts_again(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock(monotonic=0.0)
    misses = ReadMisses(ledger_id=0, clock=clock, interval_s=1.0)
    misses.note("bookie-a", MISSING, 1)
    misses.note("bookie-a", MISSING, 2)
    clock.advance(1.0)
    misses.report()
    misses.note("bookie-a", MISSING, 9)
    misses.report()  # the last line was just now
    clock.advance(1.0)
    misses.report()
    lines = _lines(caplog)
    assert lines[1].endswith("had no copy of 1 more entries (2..2); read from other replicas")
    assert "had no copy of 1 more entries (9..9)" in lines[2]
