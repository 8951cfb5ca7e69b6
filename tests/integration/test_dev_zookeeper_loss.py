"""docs/operations.md, "ZooKeeper lost its data", run through `fencepost dev` as written.

The dev ZooKeeper's data directory is wiped while the cluster is down. `dev up --wait-for 3`
starts every member: the bookies wait (their cookies name the lost cluster id) and the
brokers wait for each other, and each says so; then the brokers restore the cluster from
their stores. First after an orderly `cluster shutdown` (the stores are clean), then after a
plain `dev down` (dirty stores: manual recovery with `store inspect` and `store mark-clean`).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from broker.api.client import Client
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]


def _run(procs, *args, timeout=120, ok=True):
    result = procs.run(list(args), timeout=timeout)
    if ok:
        assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    return result


def _submit(dev_dir: Path, prefix: str, n: int) -> dict[str, str]:
    with Client.from_dev_dir(dev_dir, timeout=60) as client:
        return {
            f"{prefix}{i}": client.submit("rb", f"{prefix} {i}".encode(), key=f"{prefix}{i}")
            for i in range(n)
        }


def _assert_every_task(dev_dir: Path, acked: dict[str, str]) -> None:
    with Client.from_dev_dir(dev_dir, timeout=90) as client:
        for key, task_id in acked.items():
            assert client.get(task_id)["id"] == task_id, key
        key, task_id = next(iter(acked.items()))
        assert client.submit("rb", b"again", key=key) == task_id  # still no duplicate


def _broker_ids(procs, dev_dir: Path) -> dict[str, int]:
    rows = json.loads(_run(procs, "dev", "status", "--dev-dir", str(dev_dir), "--json").stdout)
    return {r["name"]: r["broker_id"] for r in rows if r["kind"] == "broker"}


def _leader(procs, dev_dir: Path) -> dict:
    def serving():
        view = json.loads(_run(procs, "status", "--dev-dir", str(dev_dir), "--json").stdout)
        return view if view.get("leader") is not None else None

    return wait_for(serving, 120, "a leader")


def _lose_zookeeper(procs, dev_dir: Path) -> None:
    _run(procs, "dev", "down", "--dev-dir", str(dev_dir))
    shutil.rmtree(dev_dir / "zookeeper")


def test_zookeeper_loss_runbook_through_dev(procs, tmp_path):
    dev_dir = tmp_path / "dev"
    d = str(dev_dir)
    _run(procs, "dev", "up", "--dev-dir", d, "--bookies", "3", "--brokers", "3", timeout=180)
    try:
        acked = _submit(dev_dir, "a", 40)
        ids = _broker_ids(procs, dev_dir)
        _run(procs, "cluster", "shutdown", "--dev-dir", d, timeout=120)
        _lose_zookeeper(procs, dev_dir)

        # Too many members waited for: every member starts, waits, and says for what.
        up = _run(procs, "dev", "up", "--dev-dir", d, "--wait-for", "4", timeout=180).stdout.decode()
        assert "bookie-0 started on" in up and "restore that id from their stores: waiting" in up, up
        assert "waiting: the cluster has no log: waiting for 4 members" in up, up
        rows = json.loads(_run(procs, "dev", "status", "--dev-dir", d, "--json").stdout)
        assert {r["state"] for r in rows if r["kind"] != "zookeeper"} == {"waiting"}, rows
        assert all(r.get("waiting") for r in rows if r["kind"] != "zookeeper"), rows
        assert "no leader: waiting for 4 members" in _run(procs, "status", "--dev-dir", d).stdout.decode()

        # As the runbook says: N = the number of brokers.
        _run(procs, "dev", "down", "--dev-dir", d)
        _run(procs, "dev", "up", "--dev-dir", d, "--wait-for", "3", timeout=180)
        _leader(procs, dev_dir)
        _assert_every_task(dev_dir, acked)
        assert _broker_ids(procs, dev_dir) == ids
        for name in ids:
            assert not list((dev_dir / name).glob("state.before-init-*"))

        # Not shut down in order: no store is clean, the start needs manual recovery.
        acked.update(_submit(dev_dir, "b", 20))
        time.sleep(1)
        _lose_zookeeper(procs, dev_dir)
        failed = _run(procs, "dev", "up", "--dev-dir", d, "--wait-for", "3", timeout=180, ok=False)
        assert failed.returncode == 1 and "manual recovery needed" in failed.stderr.decode(), failed.stderr
        wait_for(
            lambda: (
                not any(
                    r["alive"]
                    for r in json.loads(_run(procs, "dev", "status", "--dev-dir", d, "--json").stdout)
                    if r["kind"] == "broker"
                )
            ),
            60,
            "every broker to stop",
        )
        dirs = [str(dev_dir / name) for name in sorted(ids)]
        newest = json.loads(_run(procs, "store", "inspect", *dirs, "--json").stdout)["newest"]
        _run(procs, "store", "mark-clean", newest, "--yes")
        _run(procs, "dev", "up", "--dev-dir", d, "--wait-for", "3", timeout=180)
        _leader(procs, dev_dir)
        _assert_every_task(dev_dir, acked)
        assert _broker_ids(procs, dev_dir) == ids
    finally:
        _run(procs, "dev", "down", "--dev-dir", d, ok=False)
