"""A follower's read size: grows while it is behind, one entry once caught up."""

from __future__ import annotations

import pytest

from broker.server.store.read_batch import FIRST_READ, GROWTH, next_read_size

pytestmark = pytest.mark.timeout(30)


def test_a_full_read_grows_the_next_up_to_the_limit():
    sizes = [FIRST_READ]
    while sizes[-1] < 500:
        sizes.append(next_read_size(sizes[-1], sizes[-1], limit=500))
    assert sizes == [FIRST_READ, FIRST_READ * GROWTH, 500]
    assert next_read_size(500, 500, limit=500) == 500  # behind at the limit: stays there


def test_a_short_read_means_caught_up_and_the_next_asks_for_one():
    assert next_read_size(256, 17, limit=500) == 1
    assert next_read_size(64, 0, limit=500) == 1  # a long poll that timed out
    assert next_read_size(1, 0, limit=500) == 1


def test_one_at_a_time_until_entries_come_faster_than_it_reads():
    assert next_read_size(1, 1, limit=500) == GROWTH  # an entry was waiting: perhaps more are
    assert next_read_size(GROWTH, 2, limit=500) == 1


def test_the_limit_bounds_every_size():
    assert next_read_size(1, 1, limit=1) == 1
    assert next_read_size(300, 300, limit=500) == 500
