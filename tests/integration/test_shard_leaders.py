"""Leaders spread over the brokers, with real ZooKeeper, bookies and brokers (leader_balance_s 2).

- 3 brokers, 3 shards: within a bounded wait each broker leads exactly one shard, its preferred one;
  `shard list --json` has a row per shard with its leader, epoch, position, in-sync set, preferred
  leader and address; `status` has a line per shard; `admin insync|epochs --shard N` read that shard;
- `shard move-leader` moves one shard (balancing later hands it back to its preferred leader);
  a shard the cluster lacks is an error naming the shards there are;
- the broker leading shard 0, SIGKILLed and restarted, gets shard 0 back (its preferred) once it
  is in sync again;
- a cluster of one shard never moves its leader, wherever `admin elect` put it, and `status` prints
  no shard lines.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from election.identity import META
from election.insync import read_insync
from election.leader import read_leader
from election.shards import preferred_leader
from tests.support.harness import wait_for

pytestmark = pytest.mark.integration

SHARDS = 3
BALANCE = ["--leader-balance-s", "2"]


def _cli(procs, cluster, *args: str, ok: bool = True):
    result = procs.run([*args, "--zk", cluster.hosts, "--cluster", cluster.name], timeout=90)
    if ok:
        assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    return result


def _broker_id(proc) -> int:
    return json.loads((Path(proc.data_dir) / META).read_text())["broker_id"]


def _leaders(cluster) -> dict[int, int | None]:
    return {
        n: (read_leader(cluster.zk, cluster.paths.of_shard(n)) or {}).get("broker_id") for n in range(SHARDS)
    }


def _spread(cluster, ids: list[int]):
    """The leaders once every broker is in sync in every shard and each shard is led by its preferred
    broker (so each broker leads one shard); else None."""
    for n in range(SHARDS):
        doc, _ = read_insync(cluster.zk, cluster.paths.of_shard(n))
        if (doc or {}).get("members") != ids:
            return None
    leaders = _leaders(cluster)
    want = {n: preferred_leader(n, ids) for n in range(SHARDS)}
    return leaders if leaders == want else None


@pytest.mark.timeout(600)
def test_three_brokers_lead_one_shard_each_move_one_and_get_their_own_back(cluster, procs):
    _cli(procs, cluster, "cluster", "init", "--shards", str(SHARDS))
    procs.start_bookies(cluster, 3)
    brokers = {_broker_id(b): b for b in procs.start_brokers(cluster, 3, extra=BALANCE)}
    ids = sorted(brokers)

    leaders = wait_for(lambda: _spread(cluster, ids), 240, "each broker leading its preferred shard")
    assert sorted(leaders.values()) == ids

    rows = json.loads(_cli(procs, cluster, "shard", "list", "--json").stdout)
    assert [row["shard"] for row in rows] == [0, 1, 2]
    for row in rows:
        leader = read_leader(cluster.zk, cluster.paths.of_shard(row["shard"]))
        assert row["leader"] == leaders[row["shard"]] == row["preferred_leader"]
        assert row["leader_address"] == leader["address"] and row["epoch"] >= leader["epoch"] >= 1
        assert row["insync"] == ids and row["position"] is not None
    table = _cli(procs, cluster, "shard", "list").stdout.decode().splitlines()
    assert table[0].split()[:3] == ["SHARD", "LEADER", "EPOCH"] and len(table) == 1 + SHARDS

    status = _cli(procs, cluster, "status").stdout.decode()
    assert "shards (3;" in status
    for n in range(SHARDS):
        assert f"  {n:<4} leader={leaders[n]}  " in status, status
    view = json.loads(_cli(procs, cluster, "status", "--json").stdout)
    assert [row["leader"] for row in view["shards"]] == [leaders[n] for n in range(SHARDS)]

    insync = json.loads(_cli(procs, cluster, "admin", "insync", "--shard", "2", "--json").stdout)
    assert insync["shard"] == 2 and insync["members"] == ids and insync["leader"] == leaders[2]
    epochs = json.loads(_cli(procs, cluster, "admin", "epochs", "--shard", "1", "--json").stdout)
    assert epochs and epochs[-1]["broker_id"] == leaders[1]

    # move-leader: shard 1 to the broker that leads shard 2; balancing gives it back afterwards.
    target = leaders[2]
    moved = _cli(procs, cluster, "shard", "move-leader", "1", str(target)).stdout.decode()
    assert moved.startswith(f"shard 1: broker {target} leads"), moved
    wait_for(lambda: _spread(cluster, ids), 120, "shard 1 handed back to its preferred leader")
    # Once more with --json: one object naming the new leader (balancing hands it back again).
    moved = json.loads(_cli(procs, cluster, "shard", "move-leader", "1", str(target), "--json").stdout)
    assert (moved["shard"], moved["broker_id"]) == (1, target) and moved["epoch"] > rows[1]["epoch"]
    assert moved["address"].startswith("tcp://127.0.0.1:"), moved  # each shard has its own port
    wait_for(lambda: _spread(cluster, ids), 120, "shard 1 handed back to its preferred leader again")

    missing = _cli(procs, cluster, "shard", "move-leader", "5", str(target), ok=False)
    assert missing.returncode == 1 and b"has 3 shards (0-2): no shard 5" in missing.stderr
    missing = _cli(procs, cluster, "admin", "elect", "--shard", "3", str(target), ok=False)
    assert missing.returncode == 1 and b"no shard 3" in missing.stderr

    # SIGKILL the broker leading shard 0, then start it again: it gets shard 0 back once in sync.
    victim = brokers[leaders[0]]
    victim.kill()
    wait_for(
        lambda: _leaders(cluster)[0] not in (None, leaders[0]),
        120,
        "a new leader of shard 0 while its preferred broker is down",
    )
    brokers[leaders[0]] = procs.restart(victim)
    wait_for(lambda: _leaders(cluster)[0] == leaders[0], 240, "the restarted broker leading shard 0 again")
    wait_for(lambda: _spread(cluster, ids), 120, "every shard back on its preferred leader")


@pytest.mark.timeout(300)
def test_a_cluster_of_one_shard_never_moves_its_leader(cluster, procs):
    _cli(procs, cluster, "cluster", "init")
    procs.start_bookies(cluster, 3)
    ids = sorted(_broker_id(b) for b in procs.start_brokers(cluster, 3, extra=BALANCE))
    wait_for(lambda: read_leader(cluster.zk, cluster.paths), 120, "a leader")
    # The highest id leads: shard 0's preferred leader would be the lowest in-sync id.
    wait_for(
        lambda: json.loads(_cli(procs, cluster, "admin", "insync", "--json").stdout)["members"] == ids,
        120,
        "every broker in sync",
    )
    _cli(procs, cluster, "admin", "elect", str(ids[-1]))
    leader = read_leader(cluster.zk, cluster.paths)
    assert leader["broker_id"] == ids[-1]
    rows = json.loads(_cli(procs, cluster, "shard", "list", "--json").stdout)
    assert len(rows) == 1 and rows[0]["leader"] == ids[-1] and rows[0]["preferred_leader"] == ids[0]
    status = _cli(procs, cluster, "status").stdout.decode()
    assert "shards (" not in status
    assert "shards" not in json.loads(_cli(procs, cluster, "status", "--json").stdout)
    # Four balance periods later the same broker leads, in the same epoch.
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        assert read_leader(cluster.zk, cluster.paths) == leader
        time.sleep(0.2)
