"""The dashboard's charts without a cluster: rates from count samples, percentiles from commit-time
histograms, leader changes from the brokers' answers, the 15-minute window, and a sample from replies."""

from __future__ import annotations

import pytest

from broker.admin.dashboard.history import (
    LeaderChanges,
    MetricsHistory,
    depth,
    histogram_delta,
    histogram_quantile,
    queue_rates,
)
from broker.admin.dashboard.sampler import shard_sample

pytestmark = pytest.mark.timeout(30)

BOUNDS = [1, 2, 5, 10]


def _hist(*counts: int) -> dict:
    return {"bounds_ms": BOUNDS, "counts": list(counts)}


def _shard(n: int, leader, epoch, queues=None, commit=None) -> dict:
    return {"shard": n, "leader": leader, "epoch": epoch, "queues": queues, "commit": commit}


def test_rates_per_queue_from_two_count_samples_never_negative():
    before = {"mail": {"waiting": 5, "running": 1, "done": 10, "dead": 1}}
    after = {
        "mail": {"waiting": 6, "delayed": 2, "running": 2, "done": 14, "dead": 2},
        "new": {"waiting": 3},
    }
    rates = queue_rates(before, after, 2.0)
    # mail: 17 -> 24 tasks (delayed is part of waiting), 4 done, 1 dead over 2 s.
    assert rates == {
        "mail": {"submit": 3.5, "complete": 2.0, "dead": 0.5},
        "new": {"submit": 1.5, "complete": 0.0, "dead": 0.0},
    }
    purged = queue_rates(after, {"mail": {"waiting": 6, "running": 2, "done": 0}}, 1.0)
    assert purged["mail"] == {"submit": 0.0, "complete": 0.0, "dead": 0.0}
    assert queue_rates(before, after, 0.0) == {}
    assert depth({"waiting": 4, "delayed": 3, "running": 2, "done": 9}) == 6


def test_percentiles_from_the_difference_of_two_histograms():
    # 10 entries in the interval: 4 up to 1 ms, 4 in (1, 2], 2 in (2, 5].
    delta = histogram_delta(_hist(1, 0, 0, 0, 0), _hist(5, 4, 2, 0, 0))
    assert delta == [4, 4, 2, 0, 0]
    assert histogram_quantile(BOUNDS, delta, 0.5) == 1.25  # rank 5: a quarter into (1, 2]
    assert histogram_quantile(BOUNDS, delta, 0.99) == 4.85  # rank 9.9: 95 % into (2, 5]
    assert histogram_quantile(BOUNDS, [0, 0, 0, 0, 3], 0.5) == 10.0  # beyond the last bound: the last
    assert histogram_quantile(BOUNDS, [0] * 5, 0.5) is None  # no entry in the interval
    # Counts that fell: a new leadership counted from zero within the interval.
    assert histogram_delta(_hist(9, 9, 0, 0, 0), _hist(1, 2, 0, 0, 0)) == [1, 2, 0, 0, 0]
    assert (
        histogram_delta(None, _hist(1, 0, 0, 0, 0)) is None
        and histogram_delta(_hist(0, 0, 0, 0, 0), None) is None
    )


def test_a_leader_change_is_a_new_broker_or_epoch_once_one_answers():
    changes = LeaderChanges()
    assert changes.see({"t": 1.0, "shards": [_shard(0, 1, 3), _shard(1, 2, 5)]}) == []
    assert changes.see({"t": 2.0, "shards": [_shard(0, None, None), _shard(1, 2, 5)]}) == []  # none answers
    assert changes.see({"t": 3.0, "shards": [_shard(0, 2, 4), _shard(1, 2, 5)]}) == [
        {"t": 3.0, "shard": 0, "leader": 2, "epoch": 4, "previous": 1}
    ]
    # The same broker winning a new epoch is a change too.
    assert changes.see({"t": 4.0, "shards": [_shard(0, 2, 4), _shard(1, 2, 6)]}) == [
        {"t": 4.0, "shard": 1, "leader": 2, "epoch": 6, "previous": 2}
    ]


def test_the_history_keeps_its_window_and_draws_gaps_where_a_leader_did_not_answer():
    history = MetricsHistory(window_s=10)
    counts = [0, 4, None, 10, 16]
    for index, total in enumerate(counts):
        leader, epoch = (1, 3) if index < 3 else (2, 4)
        queues = None if total is None else {"mail": {"waiting": 2, "done": total - 2 if total else 0}}
        commit = None if total is None else _hist(total, 0, 0, 0, 0)
        history.add(
            {
                "t": 100.0 + index,
                "shards": [_shard(0, None if total is None else leader, epoch, queues, commit)],
            }
        )
    charts = history.charts()
    assert charts["t"] == [100.0, 101.0, 102.0, 103.0, 104.0] and charts["queues"] == ["mail"]
    assert charts["shards"] == 1
    assert charts["submit"]["mail"] == [None, 2.0, None, None, 6.0]  # 0 -> 4 tasks: 2 waiting, 2 done
    assert charts["complete"]["mail"] == [None, 2.0, None, None, 6.0]
    assert charts["depth"]["mail"] == [2, 2, None, 2, 2]
    assert charts["commit_p50_ms"] == [None, 0.5, None, None, 0.5]
    assert charts["leader_changes"] == [{"t": 103.0, "shard": 0, "leader": 2, "epoch": 4, "previous": 1}]
    history.add({"t": 113.5, "shards": []})  # ZooKeeper away: a sample of no shard, a gap
    charts = history.charts()
    assert charts["t"] == [104.0, 113.5] and charts["submit"]["mail"] == [None, None]
    assert charts["leader_changes"] == []  # older than the window


def test_the_rates_of_several_shards_are_summed_only_while_every_shard_answers():
    history = MetricsHistory()
    history.add(
        {"t": 1.0, "shards": [_shard(0, 1, 1, {"q": {"done": 0}}), _shard(1, 2, 1, {"q": {"done": 0}})]}
    )
    history.add(
        {"t": 2.0, "shards": [_shard(0, 1, 1, {"q": {"done": 3}}), _shard(1, 2, 1, {"q": {"done": 1}})]}
    )
    history.add({"t": 3.0, "shards": [_shard(0, 1, 1, {"q": {"done": 5}}), _shard(1, None, None)]})
    charts = history.charts()
    assert charts["complete"]["q"] == [None, 4.0, None] and charts["shards"] == 2


def test_a_shards_sample_comes_from_the_broker_answering_as_leader():
    follower = {"broker_id": 1, "role": "follower", "epoch": 4, "queues": {"q": {"waiting": 9}}}
    deposed = {"broker_id": 2, "role": "leader", "epoch": 3, "queues": {"q": {"waiting": 1}}}
    leader = {
        "broker_id": 3,
        "role": "leader",
        "epoch": 4,
        "queues": {"q": {"waiting": 2}},
        "commit_stages": {"commit_histogram": _hist(1, 0, 0, 0, 0)},
    }
    assert shard_sample(0, [follower, None, deposed, leader]) == _shard(
        0, 3, 4, {"q": {"waiting": 2}}, _hist(1, 0, 0, 0, 0)
    )
    assert shard_sample(1, [follower, None]) == _shard(1, None, None)
