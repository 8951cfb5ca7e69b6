"""Operating a sharded cluster with real processes: `cluster shutdown` of every shard, then a restart;
`snapshot list`, `store inspect` and `store verify` over every shard's store.

- 2 brokers, 3 shards, with metrics: each shard process advertises its metrics endpoint in its
  live node and every sample it serves names its shard; `snapshot list` has each shard's;
- tasks in each shard: `cluster shutdown` stops shards 1 and 2 and then
  shard 0, every broker and every shard process exits 0, every store (shard dirs included) is
  clean at its shard's entry; `store inspect` and `store verify` name each store's shard; a
  restart of both brokers serves every task again from the same stores (no snapshot download)
  and each shard's leader ends its shard's shutdown;
- with ZooKeeper only: a sharded shutdown refuses before doing anything when one shard has no
  leader, and `--abandon` forgets every shard's finished shutdown.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.admin.cluster_shutdown import ShutdownFailed, abandon_shutdown, shutdown_cluster
from broker.api.client import Client
from devtools.procs import free_port, pid_alive
from election.cluster_config import ClusterOptions, init_cluster
from election.identity import META
from election.leader import read_leader
from election.live import live_brokers
from election.local.store_status import read_status
from election.shards import shard_of_task
from election.shutdown_node import create_shutdown, read_shutdown
from tests.support.harness import wait_for

pytestmark = pytest.mark.integration

SHARDS = 3
QUEUE = "ops"
# Log lines of a store that had to be verified, rebuilt or joined by snapshot at start.
NOT_AT_THE_END = (
    "installing a snapshot",
    "installed snapshot",
    "not closed in order",
    "rebuilding the state",
)


def _run(procs, *args: str, timeout: float = 120) -> dict | list:
    result = procs.run([*args, "--json"], timeout=timeout)
    assert result.returncode == 0, (args, result.stdout.decode(), result.stderr.decode())
    return json.loads(result.stdout)


def _zk_args(cluster) -> list[str]:
    return ["--zk", cluster.hosts, "--cluster", cluster.name]


def _leaders(cluster) -> dict[int, dict] | None:
    leaders = {n: read_leader(cluster.zk, cluster.paths.of_shard(n)) for n in range(SHARDS)}
    return leaders if all(leaders.values()) else None


def _children_of(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry.name))
    return children


def _scrape(address: str) -> list[tuple[str, dict]]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return [(s.name, s.labels) for family in text_string_to_metric_families(text) for s in family.samples]


def _store_dir(broker, shard: int) -> Path:
    return Path(broker.data_dir) / "shards" / str(shard) if shard else Path(broker.data_dir)


def _submit_in_every_shard(cluster) -> dict[str, str]:
    """Keyed tasks until every shard holds some: {key: task id}."""
    acked = {}
    with Client(zk=cluster.hosts, cluster=cluster.name, timeout=30) as client:
        n = 0
        while len({shard_of_task(t) for t in acked.values()}) < SHARDS or n < 30:
            key = f"k{n}"
            acked[key] = client.submit(QUEUE, f"task {key}".encode(), key=key)
            n += 1
    return acked


@pytest.mark.timeout(480)
def test_cluster_shutdown_stops_every_shard_clean_and_a_restart_serves_every_task(cluster, procs):
    init = procs.run(["cluster", "init", *_zk_args(cluster), "--shards", str(SHARDS)])
    assert init.returncode == 0, init.stderr.decode()
    procs.start_bookies(cluster, 3)
    brokers = [
        procs.start_broker(cluster, ready=False, extra=["--metrics-listen", f"127.0.0.1:{free_port()}"])
        for _ in range(2)
    ]
    procs.wait_ready(brokers)
    ids = sorted(json.loads((Path(b.data_dir) / META).read_text())["broker_id"] for b in brokers)
    first = wait_for(lambda: _leaders(cluster), 180, "a leader in every shard")
    for n in range(SHARDS):
        wait_for(
            lambda n=n: sorted(live_brokers(cluster.zk, cluster.paths.of_shard(n))) == ids,
            90,
            f"both brokers live in shard {n}",
        )
    acked = _submit_in_every_shard(cluster)

    # Each shard process serves its own metrics, found through its live node, each sample with its shard.
    for n in range(SHARDS):
        for info in live_brokers(cluster.zk, cluster.paths.of_shard(n)).values():
            samples = _scrape(info["metrics"])
            assert samples and all(labels.get("shard") == str(n) for _, labels in samples), (n, samples[:3])
            roles = [labels["role"] for name, labels in samples if name == "fencepost_broker_role"]
            # Which one leads may move meanwhile (leader balancing): each says its role in that shard.
            assert len(roles) == 1 and roles[0] in ("leader", "follower"), roles
            assert any(name == "fencepost_broker_epoch" for name, _ in samples)

    # Every shard's leader checkpoints once it serves: the cluster-wide listing has each shard's.
    rows = wait_for(
        lambda: (lambda r: r if {row["shard"] for row in r} == set(range(SHARDS)) else None)(
            _run(procs, "snapshot", "list", *_zk_args(cluster))
        ),
        90,
        "a snapshot advertised in every shard",
    )
    assert all(row["broker_id"] in ids and row["position"] for row in rows)

    children = {b.name + str(i): _children_of(b.pid) for i, b in enumerate(brokers)}
    assert all(len(pids) == SHARDS - 1 for pids in children.values()), children
    started = time.monotonic()
    report = _run(procs, "cluster", "shutdown", "--timeout", "90", *_zk_args(cluster), timeout=300)
    took = time.monotonic() - started
    assert report["ok"], report
    assert [r["shard"] for r in report["shards"]] == list(range(SHARDS))
    for r in report["shards"]:
        assert [m["id"] for m in r["members"]] == ids
        assert all(m["state"] == "clean" and m["position"] == r["position"] for m in r["members"]), r
    for broker in brokers:
        assert broker.wait(60) == 0, broker.output()[-3000:]
        out = broker.output()
        assert "Traceback" not in out, out[-3000:]
        for n in range(1, SHARDS):  # each shard process exited 0
            ended = re.findall(rf"shard {n}: its process \(pid \d+\) (.*)", out)
            assert ended and all(
                how in ("stopped in order: not starting it again", "exited with code 0") for how in ended
            ), ended
    assert not [pid for pids in children.values() for pid in pids if pid_alive(pid)]
    for broker in brokers:
        for r in report["shards"]:
            status = read_status(_store_dir(broker, r["shard"]))
            assert status is not None and status.clean, (broker.name, r["shard"], status)
            assert status.shutdown_id == r["shutdown_id"] and list(status.position) == r["position"]

    # The stores of both brokers, each named by its shard; each shard would restart from its own.
    inspect = _run(procs, "store", "inspect", *[str(b.data_dir) for b in brokers])
    assert sorted((row["shard"], row["broker_id"]) for row in inspect["stores"]) == sorted(
        (n, i) for n in range(SHARDS) for i in ids
    )
    assert all(row["state"] == "clean" and row["error"] is None for row in inspect["stores"])
    assert [s["shard"] for s in inspect["shards"]] == list(range(SHARDS))
    assert all(s["restart"]["action"] == "restore" for s in inspect["shards"]), inspect["shards"]
    verify = _run(procs, "store", "verify", str(brokers[0].data_dir))
    assert verify["ok"] and [s["shard"] for s in verify["stores"]] == list(range(SHARDS))

    restarted = [procs.restart(b) for b in brokers]
    second = wait_for(
        lambda: (lambda ls: ls if ls and all(ls[n]["epoch"] > first[n]["epoch"] for n in ls) else None)(
            _leaders(cluster)
        ),
        180,
        "every shard led again in a later epoch",
    )
    assert second
    for n in range(SHARDS):
        wait_for(
            lambda n=n: read_shutdown(cluster.zk, cluster.paths.of_shard(n)) is None,
            60,
            f"shard {n}'s shutdown node to go",
        )
    with Client(zk=cluster.hosts, cluster=cluster.name, timeout=30) as client:
        for task_id in acked.values():
            task = client.get(task_id)
            assert task["id"] == task_id and task["shard"] == shard_of_task(task_id)
        keys = list(acked)
        again = client.submit_many(
            [{"queue": QUEUE, "payload": f"task {k}".encode(), "key": k} for k in keys]
        )
        assert again == [acked[k] for k in keys], "a task is missing or was created again"
    for proc in restarted:
        out = proc.output()
        assert not [line for line in NOT_AT_THE_END if line in out], out[-3000:]
    print(f"cluster shutdown of 2 brokers x {SHARDS} shards took {took:.1f} s")


def _sharded(cluster) -> None:
    init_cluster(cluster.zk, cluster.paths, ClusterOptions(), clock=time.time, shards=SHARDS)


def _live(cluster, shard: int, broker_id: int) -> None:
    cluster.zk.create(
        cluster.paths.of_shard(shard).live_broker(broker_id),
        json.dumps({"address": "tcp://127.0.0.1:9", "name": f"b{broker_id}"}).encode(),
        ephemeral=True,
        makepath=True,
    )


def test_a_sharded_shutdown_refuses_before_anything_when_a_shard_has_no_leader(cluster):
    _sharded(cluster)
    for n in range(SHARDS):
        _live(cluster, n, 1)
        if n != 2:
            cluster.zk.create(
                cluster.paths.of_shard(n).leader,
                json.dumps({"broker_id": 1, "address": "tcp://127.0.0.1:9", "epoch": 1}).encode(),
                ephemeral=True,
                makepath=True,
            )
    with pytest.raises(ShutdownFailed, match="shard 2: no leader serves.*nothing was shut down"):
        shutdown_cluster(cluster.zk, cluster.name, timeout=5)
    assert not [n for n in range(SHARDS) if read_shutdown(cluster.zk, cluster.paths.of_shard(n))]


def test_abandon_forgets_every_shard_s_finished_shutdown_and_none_while_one_runs(cluster):
    _sharded(cluster)
    with pytest.raises(ShutdownFailed, match="no cluster shutdown is recorded"):
        abandon_shutdown(cluster.zk, cluster.name)
    for n in (0, 2):
        create_shutdown(cluster.zk, cluster.paths.of_shard(n), f"s{n}", [1], clock=lambda: 5.0)
    _live(cluster, 2, 1)  # shard 2's member runs and has not recorded its stop
    with pytest.raises(ShutdownFailed, match="s2 of shard 2 is in progress: brokers 1"):
        abandon_shutdown(cluster.zk, cluster.name)
    assert read_shutdown(cluster.zk, cluster.paths) is not None  # nothing was deleted
    cluster.zk.delete(cluster.paths.of_shard(2).live_broker(1))
    done = abandon_shutdown(cluster.zk, cluster.name)
    assert done["abandoned"] and [(d["shard"], d["shutdown_id"]) for d in done["shards"]] == [
        (0, "s0"),
        (2, "s2"),
    ]
    assert not [n for n in range(SHARDS) if read_shutdown(cluster.zk, cluster.paths.of_shard(n))]
