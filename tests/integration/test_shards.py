"""Shards with real ZooKeeper, bookies and brokers: every broker runs a process per shard n > 0.

- `cluster init --shards 3` and three brokers: each shard elects its own leader with its own
  epoch (`shards/<n>/leader`, `shards/<n>/epoch`), each broker is live in each shard, a submit
  to shard 2's leader makes an id ending in `-s2` that reaches every broker's shard-2 store;
  a SIGKILLed broker leaves no process of its shards behind, the shards it led get new leaders
  and the others keep theirs;
- a cluster made by `cluster init` without `--shards` starts as before: no `shards/` node, no
  process but the broker's, no `shards/` directory, task ids of 32 hex digits;
- the ledgers of every shard share `ledgers/`: a shard's retention deletes the closed ledgers left
  out of its own log, never another shard's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from broker.server.store.checkpoints import Checkpointer, CheckpointHost
from broker.state.store import StateStore
from devtools.procs import pid_alive
from election.identity import META
from election.leader import read_epoch, read_leader
from election.live import live_brokers
from ledger.log import write_log
from ledger.metadata import CLOSED, LedgerMetadata, create_metadata, list_ledgers
from snapshots.policy import CheckpointPolicy
from tests.support.clock import FakeClock
from tests.support.harness import call, wait_for

pytestmark = pytest.mark.integration

SHARDS = 3


def _init(procs, cluster, *flags: str) -> None:
    result = procs.run(["cluster", "init", "--zk", cluster.hosts, "--cluster", cluster.name, *flags])
    assert result.returncode == 0, result.stderr.decode()


def _broker_id(proc) -> int:
    return json.loads((Path(proc.data_dir) / META).read_text())["broker_id"]


def _children_of(pid: int) -> list[int]:
    """The pids whose parent is ``pid``."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            children.append(int(entry.name))
    return children


def _cmdline(pid: int) -> list[str]:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def _leaders(cluster) -> dict[int, dict]:
    return {n: read_leader(cluster.zk, cluster.paths.of_shard(n)) for n in range(SHARDS)}


def _submit(address: str) -> dict:
    """A submit sent by hand to one shard's leader; retried while it is not accepting writes yet."""
    deadline = time.monotonic() + 60
    while True:
        reply = call(address, "submit", queue="q", payload=b"by hand", timeout=10)
        if reply.get("ok") or time.monotonic() > deadline:
            return reply
        time.sleep(0.2)


def _stored(data_dir: Path, task_id: str) -> bool:
    state = data_dir / "state"
    if not (state / "data.mdb").exists():
        return False
    store = StateStore(state, readonly=True)
    try:
        return store.get_task(task_id) is not None
    finally:
        store.close()


@pytest.mark.timeout(420)
def test_three_shards_each_elect_serve_and_fail_over_alone(cluster, procs):
    _init(procs, cluster, "--shards", str(SHARDS))
    procs.start_bookies(cluster, 3)
    brokers = procs.start_brokers(cluster, 3)
    ids = {_broker_id(b): b for b in brokers}
    assert sorted(ids) == [1, 2, 3]

    # Each shard has its own leader and epoch; shards other than 0 keep them under shards/<n>/.
    leaders = wait_for(
        lambda: (lambda ls: ls if all(ls.values()) else None)(_leaders(cluster)),
        180,
        "a leader in every shard",
    )
    for n, leader in leaders.items():
        paths = cluster.paths.of_shard(n)
        assert leader["broker_id"] in ids and read_epoch(cluster.zk, paths)[0] == leader["epoch"] >= 1
        assert paths.leader == (
            f"/fencepost/{cluster.name}/leader" if n == 0 else f"/fencepost/{cluster.name}/shards/{n}/leader"
        )
    assert len({leaders[n]["address"] for n in range(SHARDS)}) == SHARDS  # one process per shard

    # Every broker is live in every shard, under its one broker id.
    for n in range(SHARDS):
        wait_for(
            lambda n=n: sorted(live_brokers(cluster.zk, cluster.paths.of_shard(n))) == [1, 2, 3],
            60,
            f"every broker live in shard {n}",
        )
    # Each broker runs one process per other shard, and only those.
    for broker in brokers:
        shards = sorted(int(c[c.index("--shard") + 1]) for c in map(_cmdline, _children_of(broker.pid)) if c)
        assert shards == [1, 2], (broker.name, shards)

    # A submit to shard 2's leader: its id names shard 2 and every broker's shard-2 store gets it.
    reply = _submit(leaders[2]["address"])
    assert reply.get("ok"), reply
    task_id = reply["task_id"]
    assert task_id.endswith("-s2") and len(task_id) == 35
    assert call(leaders[2]["address"], "status")["shard"] == 2
    for broker in brokers:
        wait_for(
            lambda b=broker: _stored(Path(b.data_dir) / "shards" / "2", task_id),
            60,
            f"{task_id} in the shard-2 store of {broker.name}",
        )
        assert not _stored(Path(broker.data_dir), task_id)  # shard 0's store knows nothing of it

    # SIGKILL the broker leading shard 2: its shard processes die with it, the shards it led get
    # new leaders, the others keep theirs.
    victim_id = leaders[2]["broker_id"]
    victim = ids[victim_id]
    children = _children_of(victim.pid)
    assert len(children) == SHARDS - 1
    victim.kill()
    wait_for(
        lambda: not any(pid_alive(p) for p in children), 10, "the killed broker's shard processes to die"
    )
    led = [n for n in range(SHARDS) if leaders[n]["broker_id"] == victim_id]
    for n in led:
        moved = wait_for(
            lambda n=n: (lambda x: x if x and x["broker_id"] != victim_id else None)(
                read_leader(cluster.zk, cluster.paths.of_shard(n))
            ),
            90,
            f"a new leader of shard {n}",
        )
        assert moved["epoch"] > leaders[n]["epoch"]
    for n in set(range(SHARDS)) - set(led):
        assert read_leader(cluster.zk, cluster.paths.of_shard(n))["epoch"] == leaders[n]["epoch"]
    assert call(read_leader(cluster.zk, cluster.paths.of_shard(2))["address"], "get", task_id=task_id)["ok"]


@pytest.mark.timeout(240)
def test_a_cluster_initialized_without_shards_starts_as_before(cluster, procs):
    _init(procs, cluster)
    procs.start_bookies(cluster, 3)
    (broker,) = procs.start_brokers(cluster, 1)
    leader = wait_for(lambda: read_leader(cluster.zk, cluster.paths), 120, "a leader")
    assert leader["address"] == broker.address
    reply = _submit(broker.address)
    assert reply.get("ok"), reply
    assert len(reply["task_id"]) == 32 and "-s" not in reply["task_id"]
    config = json.loads(cluster.zk.get(cluster.paths.config)[0])
    assert "shards" not in config
    assert cluster.zk.exists(cluster.paths.shards) is None
    assert _children_of(broker.pid) == []
    assert not (Path(broker.data_dir) / "shards").exists()


class _Ledgers:
    """The ledger client retention uses: lists the real `ledgers/`, records what it deletes."""

    def __init__(self, cluster) -> None:
        self.cluster, self.deleted = cluster, []

    def list_ledgers(self) -> list[int]:
        return list_ledgers(self.cluster.zk, self.cluster.paths)

    def delete(self, ledger_id: int) -> None:
        self.deleted.append(ledger_id)


class _Catalog:
    def latest_valid(self):
        return None


def _ledger(cluster, shard: int) -> int:
    paths = cluster.paths.of_shard(shard)
    member = {"bookie_id": "b", "address": "tcp://127.0.0.1:1"}
    meta = LedgerMetadata(-1, [member], 1, 1, state=CLOSED, extra={"shard": shard} if shard else {})
    return create_metadata(cluster.zk, paths, meta)[0]


def _retention(cluster, shard: int) -> list[int]:
    """What the retention of ``shard``'s leader deletes (no snapshot covers anything: orphans only)."""
    ledgers = _Ledgers(cluster)
    host = CheckpointHost(
        zk=cluster.zk,
        paths=cluster.paths.of_shard(shard),
        ledgers=ledgers,
        catalog=_Catalog(),
        cluster_id="c",
        broker_id=1,
        clock=FakeClock(),
        policy=CheckpointPolicy(1000, 600.0),
        snapshots_kept=1,
        retention_seconds=0.0,
        store=lambda: None,
        applied_entries=lambda: 0,
        leading=lambda: True,
        store_damaged=lambda exc: None,
        live_changed=lambda: None,
        epoch_claim=object,  # leading: retention runs
    )
    Checkpointer(host).apply_retention()
    return ledgers.deleted


def test_retention_of_a_shard_leaves_other_shards_ledgers_alone(cluster):
    # In id order: a closed ledger left out of shard 0's log, one left out of shard 1's, shard
    # 1's log, shard 0's log. Each shard's log head is above both orphans.
    shard0_orphan, shard1_orphan = _ledger(cluster, 0), _ledger(cluster, 1)
    shard1_head, shard0_head = _ledger(cluster, 1), _ledger(cluster, 0)
    write_log(cluster.zk, cluster.paths, [{"id": shard0_head, "epoch": 1}], -1, None)
    # The first log of shard 1: its shards/1 node is made with it.
    write_log(cluster.zk, cluster.paths.of_shard(1), [{"id": shard1_head, "epoch": 1}], -1, None)
    assert _retention(cluster, 0) == [shard0_orphan]
    assert _retention(cluster, 1) == [shard1_orphan]
