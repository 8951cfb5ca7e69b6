"""Which snapshot a joiner may install (broker/server/store/join_choice.py), over every small case."""

from __future__ import annotations

import itertools

import pytest

from broker.server.store.join_choice import choose_sources, covers_log_start
from ledger.log import LogGap, position_after, resume_position

pytestmark = pytest.mark.timeout(60)

LOGS = [[], [3], [3, 5], [5, 6], [2, 3, 5]]
SEEDS = [None, (2, 7)]
POSITIONS = [(ledger, entry) for ledger in (-1, 1, 2, 3, 4, 5, 6, 9) for entry in (-1, 0, 4)]


def expected_cover(position, log_ids, truncated, seed) -> bool:
    """The rule in the log's terms: at or after (first ledger, -1), or the seed itself (with a seed,
    nothing else: an empty log re-created from it covers no older position)."""
    if seed is not None:
        return position == seed or (bool(log_ids) and position >= (log_ids[0], -1))
    if position[0] < 0:
        return not truncated
    return not log_ids or position >= (log_ids[0], -1)


@pytest.mark.parametrize("log_ids", LOGS)
@pytest.mark.parametrize("truncated", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_covers_exactly_the_positions_at_or_after_the_log_start(log_ids, truncated, seed):
    for position in POSITIONS:
        covered = covers_log_start(position, log_ids, truncated, seed)
        assert covered == expected_cover(position, log_ids, truncated, seed), (position, log_ids, seed)
        if covered and position[0] >= 0:
            # What the tail does next never meets a gap.
            position_after(resume_position(position, seed), log_ids)
        elif not covered and position[0] >= 0 and (seed is None or log_ids):
            with pytest.raises(LogGap):
                position_after(position, log_ids)


def _sources(positions):
    return [
        {"broker_id": i + 1, "address": f"tcp://b{i + 1}", "position": list(p), "checksum": 100 + i}
        for i, p in enumerate(positions)
    ]


SOURCE_POSITIONS = [(1, 4), (2, 7), (3, -1), (3, 4), (5, 0)]


def test_a_survivors_older_snapshot_does_not_cover_an_empty_log_recreated_from_its_seed():
    """After ZooKeeper lost its data the log is re-created from a clean store at the seed, empty at
    first: a snapshot that store's broker took before the loss (at its start, say) is older state."""
    sources = _sources([(0, 0), (0, 120)])
    assert not covers_log_start((0, 0), [], True, (0, 120))
    assert not covers_log_start((-1, -1), [], False, (0, 120))
    assert [s["position"] for s in choose_sources(sources, [], True, (0, 120)).sources] == [[0, 120]]
    waiting = choose_sources(sources[:1], [], True, (0, 120))
    assert waiting.sources == () and "the seed (0, 120)" in waiting.reason


@pytest.mark.parametrize("log_ids", LOGS)
@pytest.mark.parametrize("truncated", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_choice_keeps_the_covering_sources_in_order_and_says_why_when_none(log_ids, truncated, seed):
    for count in range(0, 4):
        for positions in itertools.permutations(SOURCE_POSITIONS, count):
            sources = _sources(positions)
            checksums = [s["checksum"] for s in sources]
            for k in range(len(checksums) + 1):
                for refused in itertools.combinations(checksums, k):
                    choice = choose_sources(sources, log_ids, truncated, seed, set(refused))
                    want = [
                        s
                        for s in sources
                        if s["checksum"] not in refused
                        and expected_cover(tuple(s["position"]), log_ids, truncated, seed)
                    ]
                    assert list(choice.sources) == want
                    assert bool(choice.reason) == (not want)
                    if not want and sources:
                        assert "covers the log start" in choice.reason
                        assert all(f"broker {s['broker_id']}'s" in choice.reason for s in sources)
                    if not sources:
                        assert "serve a snapshot" in choice.reason


def test_a_snapshot_older_than_the_log_start_is_passed_over_for_one_that_covers_it():
    old, covering = _sources([(2, 9), (7, 3)])
    # `snapshots/latest` named the old one, so it came first.
    choice = choose_sources([old, covering], log_ids=[7, 8], log_truncated=True)
    assert choice.sources == (covering,)


def test_only_an_old_snapshot_means_waiting_and_the_reason_names_it():
    (old,) = _sources([(2, 9)])
    choice = choose_sources([old], log_ids=[7, 8], log_truncated=True)
    assert choice.sources == ()
    assert "ledger 7" in choice.reason and "broker 1's at (2, 9)" in choice.reason


def test_a_snapshot_refused_once_is_never_offered_again_even_if_it_would_cover():
    (snap,) = _sources([(7, 3)])
    choice = choose_sources([snap], log_ids=[7, 8], log_truncated=True, refused={snap["checksum"]})
    assert choice.sources == () and "installed once already" in choice.reason
