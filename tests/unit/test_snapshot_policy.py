"""The checkpoint policy: a decision table."""

from __future__ import annotations

import pytest

from snapshots.policy import CheckpointPolicy, PolicyError


@pytest.mark.parametrize(
    "entries, seconds, due",
    [
        (0, 0.0, False),
        (0, 1e9, False),  # nothing changed: never due on time alone
        (1, 0.0, False),
        (999, 599.9, False),
        (1000, 0.0, True),  # entries threshold, inclusive
        (5000, 0.0, True),
        (1, 600.0, True),  # time threshold, inclusive, something changed
        (1, 601.0, True),
        (-5, 1e9, False),
    ],
)
def test_checkpoint_due(entries, seconds, due):
    assert CheckpointPolicy(every_entries=1000, every_seconds=600.0).due(entries, seconds) is due


def test_checkpoint_triggers_can_be_disabled():
    only_time = CheckpointPolicy(every_entries=None, every_seconds=10.0)
    assert not only_time.due(10**9, 9.0) and only_time.due(1, 10.0)
    only_entries = CheckpointPolicy(every_entries=10, every_seconds=None)
    assert not only_entries.due(9, 1e12) and only_entries.due(10, 0.0)
    never = CheckpointPolicy(None, None)
    assert not never.due(10**12, 1e12)


@pytest.mark.parametrize(
    "kw",
    [
        {"every_entries": 0, "every_seconds": 1.0},
        {"every_entries": 5, "every_seconds": 0},
        {"every_entries": -1, "every_seconds": 1.0},
        {"every_entries": True, "every_seconds": 1.0},
    ],
)
def test_checkpoint_refuses_nonsense(kw):
    with pytest.raises(PolicyError):
        CheckpointPolicy(**kw)
