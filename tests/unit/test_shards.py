"""Shards (pure): key and task id -> shard, preferred leaders, per-shard ZooKeeper paths."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from election import ElectionError
from election.paths import ClusterPaths
from election.shards import (
    check_shards,
    leader_counts,
    preferred_leader,
    shard_of_key,
    shard_of_task,
    task_id_in_shard,
)

# Fixed forever: a key's shard must not change with a version, or a resubmit after an upgrade
# would miss its idempotency record and make a second task.
GOLDEN = {("a", 4): 3, ("order-17", 4): 0, ("", 4): 0, ("é", 4): 3, ("x", 7): 5}


def test_the_shard_of_a_key_never_changes():
    assert {args: shard_of_key(*args) for args in GOLDEN} == GOLDEN


def test_the_shard_of_a_key_is_the_same_in_another_process():
    # Python's own hash() is salted per process; the shard hash must not be.
    code = "from election.shards import shard_of_key; print([shard_of_key(f'k{i}', 16) for i in range(50)])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == str([shard_of_key(f"k{i}", 16) for i in range(50)])


def test_keys_spread_over_every_shard():
    counts = Counter(shard_of_key(f"order-{i}", 8) for i in range(8000))
    assert set(counts) == set(range(8)) and min(counts.values()) > 850


@given(st.text(max_size=60), st.integers(1, 64))
def test_a_key_lands_in_a_shard_of_the_cluster(key, shards):
    assert 0 <= shard_of_key(key, shards) < shards
    assert shard_of_key(key, 1) == 0


@given(st.text(alphabet="0123456789abcdef", min_size=32, max_size=32), st.integers(0, 63))
def test_a_task_id_names_its_shard(base, shard):
    task_id = task_id_in_shard(base, shard)
    assert shard_of_task(task_id) == shard
    assert (task_id == base) == (shard == 0)


@pytest.mark.parametrize(
    "task_id", ["01a2203ca67f3649880500a47d8a6158", "my-own-id", "x-s", "x-s01", "-s3", "x-s99"]
)
def test_ids_without_a_valid_mark_are_shard_0(task_id):
    assert shard_of_task(task_id) == 0


@pytest.mark.parametrize("bad", [0, 65, -1, True, "2", 1.5])
def test_bad_shard_counts_are_refused(bad):
    with pytest.raises(ElectionError):
        check_shards(bad)


def test_preferred_leaders_are_balanced_for_every_cluster_up_to_7_brokers_and_16_shards():
    for brokers in range(1, 8):
        insync = list(range(1, brokers + 1))
        for shards in range(1, 17):
            counts = leader_counts(shards, {s: insync for s in range(shards)})
            assert sum(counts.values()) == shards
            led = [counts.get(b, 0) for b in insync]
            assert max(led) - min(led) <= 1, (brokers, shards, counts)


def test_only_in_sync_brokers_are_preferred():
    assert preferred_leader(0, []) is None
    for shard in range(10):
        assert preferred_leader(shard, [7, 3]) in (3, 7)
    assert preferred_leader(1, [3, 1, 2, 2]) == 2  # sorted, duplicates once


def test_shard_0_keeps_the_paths_of_before_shards_and_others_have_their_own():
    zero, two = ClusterPaths("dev"), ClusterPaths("dev", shard=2)
    assert zero.epoch == "/fencepost/dev/epoch" and zero.live_brokers == "/fencepost/dev/brokers/live"
    for name in ("election", "epoch", "leader", "insync", "log", "log_start", "shutdown", "elect", "init"):
        assert getattr(two, name) == f"/fencepost/dev/shards/2/{name}"
    assert two.snapshots_latest == "/fencepost/dev/shards/2/snapshots/latest"
    assert two.live_brokers == "/fencepost/dev/shards/2/live"
    for shared in ("config", "bookies", "brokers", "ledgers", "underreplicated", "auditor", "broker_ids"):
        assert getattr(two, shared) == getattr(zero, shared)
    assert two.of_shard(0) == zero
    with pytest.raises(ElectionError):
        ClusterPaths("dev", shard=64)
