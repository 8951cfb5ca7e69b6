"""Shards with real ZooKeeper, bookies and brokers: every broker runs a process per shard n > 0.

- `cluster init --shards 3` and three brokers: each shard elects its own leader with its own
  epoch (`shards/<n>/leader`, `shards/<n>/epoch`), each broker is live in each shard, a submit
  to shard 2's leader makes an id ending in `-s2` that reaches every broker's shard-2 store;
  a SIGKILLed broker leaves no process of its shards behind, the shards it led get new leaders
  and the others keep theirs;
- a cluster made by `cluster init` without `--shards` starts as before: no `shards/` node, no
  process but the broker's, no `shards/` directory, task ids of 32 hex digits;
- `dev up --shards 2` makes a 2-shard cluster whose brokers run their shard-1 processes, and
  `dev down` leaves none of them behind;
- the ledgers of every shard share `ledgers/`: a shard's retention deletes the closed ledgers left
  out of its own log, never another shard's.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from broker.server.store.checkpoints import Checkpointer, CheckpointHost
from broker.state.store import StateStore
from devtools.procs import pid_alive
from election.identity import META
from election.leader import read_epoch, read_leader
from election.live import live_brokers
from election.paths import ClusterPaths
from election.zk import close, connect
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
    brokers = procs.start_brokers(cluster, 3, extra=["--leader-balance-s", "0"])
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

    # A shard process that dies is started again by its broker, on a new port, and is live again.
    survivor = next(b for i, b in ids.items() if i != victim_id)
    survivor_id = _broker_id(survivor)
    old = {int(_cmdline(p)[_cmdline(p).index("--shard") + 1]): p for p in _children_of(survivor.pid)}
    old_address = live_brokers(cluster.zk, cluster.paths.of_shard(1))[survivor_id]["address"]
    os.kill(old[1], signal.SIGKILL)
    wait_for(
        lambda: (
            (live_brokers(cluster.zk, cluster.paths.of_shard(1)).get(survivor_id) or {}).get("address")
            not in (None, old_address)
        ),
        60,
        "the shard-1 process of the survivor started again",
    )
    assert old[2] in _children_of(survivor.pid) and old[1] not in _children_of(survivor.pid)
    assert "shard 1: its process" in survivor.output() and "was killed by SIGKILL" in survivor.output()

    # SIGTERM: the broker stops its shard processes in order and exits 0 within its budget.
    children = _children_of(survivor.pid)
    assert survivor.terminate(timeout=20) == 0, survivor.output()[-3000:]
    assert not any(pid_alive(p) for p in children)
    for n in range(SHARDS):
        data = Path(survivor.data_dir) / "shards" / str(n) if n else Path(survivor.data_dir)
        store = StateStore(data / "state", readonly=True)
        try:
            assert store.was_clean(), f"the shard-{n} store was not closed in order"
        finally:
            store.close()
    assert "[shard 2]" in survivor.output()  # the shard processes log where their broker does


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


@pytest.mark.timeout(240)
def test_dev_up_with_shards_and_down_leaves_no_shard_process(procs, tmp_path):
    dev_dir = str(tmp_path / "dev")
    up = procs.run(
        ["dev", "up", "--dev-dir", dev_dir, "--cluster", "sharded", "--shards", "2", "--brokers", "2"]
    )
    assert up.returncode == 0, up.stderr.decode() + up.stdout.decode()
    try:
        state = json.loads((tmp_path / "dev" / "cluster.json").read_text())
        brokers = [m for m in state["processes"] if m["kind"] == "broker"]
        zk = connect(state["zk"])
        try:
            assert json.loads(zk.get(ClusterPaths("sharded").config)[0])["shards"] == 2
            wait_for(lambda: read_leader(zk, ClusterPaths("sharded", shard=1)), 120, "a leader of shard 1")
        finally:
            close(zk)
        children = [pid for broker in brokers for pid in _children_of(broker["pid"])]
        assert len(children) == 2 and all("--shard" in _cmdline(pid) for pid in children)
    finally:
        down = procs.run(["dev", "down", "--dev-dir", dev_dir])
    assert down.returncode == 0, down.stderr.decode()
    assert not [pid for pid in children + [b["pid"] for b in brokers] if pid_alive(pid)]


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
