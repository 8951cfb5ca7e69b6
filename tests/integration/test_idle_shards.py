"""An idle shard writes nothing: 10 shards with no load for 30 s add no entry to any log.

A shard's leader writes entries for requests, state digests every ``digest_every_entries``
entries and rolls of full ledgers: with no request none of these comes due. This test
watches for 30 s (a window of nothing happening has to be waited out) after every shard has
a leader that has committed its takeover.
"""

from __future__ import annotations

import time

import pytest

from broker.admin.status import ask
from devtools.dev_spec import DevClusterSpec
from devtools.devcluster import DevCluster
from election.leader import read_leader
from election.paths import ClusterPaths
from election.zk import close, connect
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SHARDS = 10
CLUSTER = "idle"
WINDOW_S = 30.0


def positions(zk) -> dict[int, tuple | None]:
    """Each shard's position as its leader reports it (None: no leader or no answer)."""
    out = {}
    for shard in range(SHARDS):
        leader = read_leader(zk, ClusterPaths(CLUSTER, shard))
        reply = ask(leader["address"], "status") if leader else None
        out[shard] = tuple(reply["position"]) if reply and reply.get("role") == "leader" else None
    return out


def test_ten_idle_shards_write_nothing_for_30_seconds(tmp_path):
    dev = DevCluster(tmp_path / "dev", private=True)
    zk = None
    try:
        state = dev.up(DevClusterSpec(cluster=CLUSTER, shards=SHARDS, brokers=1, bookies=3))
        zk = connect(state["zk"])

        def all_served():
            now = positions(zk)
            return now if all(v is not None for v in now.values()) else None

        before = wait_for(all_served, 120, "a serving leader in every shard")
        time.sleep(WINDOW_S)
        after = positions(zk)
        moved = {
            shard: (before[shard], after[shard]) for shard in range(SHARDS) if after[shard] != before[shard]
        }
        assert moved == {}, f"idle shards wrote entries in {WINDOW_S:g} s: {moved}"
    finally:
        if zk is not None:
            close(zk)
        dev.down()
