"""Which bookies of a recovered ledger's last fragment may lack entries (``lacking_copies``, pure)."""

from __future__ import annotations

import pytest

from ledger.client.recovery import lacking_copies

pytestmark = pytest.mark.timeout(10)


def test_every_fenced_bookie_holding_the_committed_entries_lacks_nothing():
    replies = {i: {"last_entry": 9, "lac": 8} for i in range(3)}
    assert lacking_copies(3, replies, 0, 8, 9) == {}


def test_a_fenced_bookie_behind_the_lac_lacks_the_entries_after_its_last():
    replies = {0: {"last_entry": 9}, 1: {"last_entry": 6}, 2: {"last_entry": 9}}
    assert lacking_copies(3, replies, 0, 8, 9) == {1: 7}


def test_a_fenced_bookie_behind_only_past_the_lac_got_those_from_the_recovery_itself():
    replies = {0: {"last_entry": 9}, 1: {"last_entry": 8}, 2: {"last_entry": 9}}
    assert lacking_copies(3, replies, 0, 8, 9) == {}


def test_a_bookie_that_was_not_fenced_may_lack_the_whole_last_fragment():
    replies = {0: {"last_entry": 40}, 1: {"last_entry": 40}}
    assert lacking_copies(3, replies, 25, 40, 40) == {2: 25}


def test_a_bookie_behind_the_fragment_start_lacks_from_the_start_only():
    replies = {0: {"last_entry": 40}, 1: {"last_entry": 3}, 2: {"last_entry": 40}}
    assert lacking_copies(3, replies, 25, 40, 40) == {1: 25}


def test_an_empty_ledger_lacks_nothing_whoever_answered():
    assert lacking_copies(3, {0: {"last_entry": -1}, 1: {"last_entry": -1}}, 0, -1, -1) == {}
