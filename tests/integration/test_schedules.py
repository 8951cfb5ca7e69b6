"""Periodic tasks on a real cluster (ZooKeeper, 3 bookies, 3 brokers).

- `schedule add` is refused (exit 1, naming `fencepost cluster enable-feature schedules`) until the
  flag is enabled;
- a schedule every second across two leader SIGKILLs: each occurrence is submitted exactly once,
  no gap and no double, counted by the tasks' occurrence keys, for about a minute (60 occurrences;
  the first kill lands 3 ms after an occurrence, while its entry is likely in flight);
- after `fencepost cluster shutdown`, an outage longer than the schedules' grace (2 s) and a restart
  on the same data dirs, each catch-up policy does what it says: ``all`` fires every missed
  occurrence late, ``last`` only the latest missed one (late) and ``none`` none, and each schedule's
  ``skipped`` counts exactly the occurrences missing from its tasks.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest

from broker.api.client import Client
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration]

S = 1000


def _run(bc, *args, timeout: float = 60):
    return bc.procs.run([*args, "--zk", bc.zk_hosts, "--cluster", bc.cluster.name], timeout=timeout)


def _ok(result) -> dict | list:
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    return json.loads(result.stdout)


def _occurrence_ms(key: str) -> int:
    """The occurrence a default key (``schedule:{name}:{occurrence}``) names, in ms."""
    text = key.rsplit(":", 3)[-3:]
    stamp = datetime.strptime(":".join(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    return int(stamp.timestamp()) * S


def _tasks(client: Client, queue: str) -> list[dict]:
    """Every task of ``queue`` with its key (listings carry no key: each is read)."""
    return [client.get(row["id"]) for row in client.iter_tasks(queue=queue)]


def _fired(client: Client, name: str) -> int:
    rows = client.schedules(name)
    return rows[0]["fired"] if rows else 0


def _at_fraction_of_a_second(offset: float) -> None:
    """Return once wall time is ``offset`` (to about a millisecond) past a whole second.

    It sleeps until shortly before the fraction and spins from there; on a loaded machine the
    spinning thread can be descheduled across the 2 ms window, so it tries again each second, for
    up to 30 of them.
    """
    deadline = time.monotonic() + 30
    while not offset <= time.time() % 1 < offset + 0.002:
        assert time.monotonic() < deadline, "wall time never reached the fraction"
        early = (offset - time.time() % 1) % 1 - 0.005
        if early > 0:
            time.sleep(early)


def _enable(bc) -> None:
    refused = _run(bc, "schedule", "add", "early", "--queue", "q", "--cron", "* * * * *")
    assert refused.returncode == 1, refused.stdout.decode() + refused.stderr.decode()
    assert "fencepost cluster enable-feature schedules" in refused.stderr.decode()
    _ok(_run(bc, "cluster", "enable-feature", "schedules", "--json"))


@pytest.mark.timeout(300)
def test_a_schedule_every_second_submits_each_occurrence_once_across_leader_sigkills(broker_cluster):
    bc = broker_cluster
    _enable(bc)
    added = _ok(
        _run(
            bc,
            "schedule",
            "add",
            "tick",
            "--queue",
            "beats",
            "--cron",
            "* * * * * *",
            "--payload",
            "b",
            "--json",
        )
    )
    assert added["created"] and added["catch_up"] == "last" and added["grace_ms"] == 60_000
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
        for target, offset in ((15, 0.003), (35, 0.4)):
            wait_for(lambda: _fired(client, "tick") >= target, 90, f"{target} occurrences fired")
            old = bc.leader_proc()
            old_id = bc.wait_leader()["broker_id"]
            _at_fraction_of_a_second(offset)  # 3 ms after an occurrence: its entry is likely in flight
            old.kill()
            bc.wait_leader(timeout=60, not_id=old_id)
            bc.brokers[bc.brokers.index(old)] = bc.procs.restart(old)
        wait_for(lambda: _fired(client, "tick") >= 60, 90, "60 occurrences fired")
        paused = _ok(_run(bc, "schedule", "pause", "tick", "--json"))
        assert paused["paused"]  # answered once applied: nothing fires after it, so what follows agrees
        [rec] = client.schedules("tick")
        tasks = _tasks(client, "beats")
    occurrences = sorted(_occurrence_ms(t["key"]) for t in tasks)
    assert len(occurrences) == len(set(occurrences)) == rec["fired"], (len(occurrences), rec["fired"])
    first, last = occurrences[0], occurrences[-1]
    assert occurrences == list(range(first, last + S, S)), "a gap in the occurrences"
    assert last == rec["last_ms"] and rec["skipped"] == 0
    assert first <= added["created_ms"] + S + 999  # the first occurrence after the add fired
    assert all(t["payload"] == b"b" for t in tasks)
    listed = _ok(_run(bc, "schedule", "list", "--json"))
    assert [r["name"] for r in listed] == ["tick"] and listed[0]["next_ms"] is None  # paused
    removed = _ok(_run(bc, "schedule", "remove", "tick", "--json"))
    assert removed == {"name": "tick", "removed": True}
    again = _run(bc, "schedule", "remove", "tick")
    assert again.returncode == 1 and "no schedule 'tick'" in again.stderr.decode()


def _shutdown_and_restart(bc, outage_s: float) -> float:
    """`cluster shutdown`, every broker exits, wall time passes ``outage_s``, the brokers start again;
    returns when a leader serves (the wall time the outage began)."""
    report = _ok(_run(bc, "cluster", "shutdown", "--json", "--timeout", "60", timeout=90))
    assert report["ok"]
    for proc in bc.brokers:
        assert proc.wait(30) == 0, proc.output()[-3000:]
    stopped = time.time()
    wait_for(lambda: time.time() >= stopped + outage_s, outage_s + 5, "the outage to outlast the grace")
    bc.brokers[:] = [bc.procs.restart(p) for p in bc.brokers]
    bc.wait_leader(timeout=90)
    return stopped


@pytest.mark.timeout(300)
def test_catch_up_policies_after_a_cluster_shutdown_and_restart(broker_cluster):
    bc = broker_cluster
    _enable(bc)
    grace_ms = 2 * S
    for policy in ("all", "last", "none"):
        _ok(
            _run(
                bc, "schedule", "add", policy, "--queue", policy, "--cron", "* * * * * *",
                "--catch-up", policy, "--grace", "2s", "--json",
            )
        )  # fmt: skip
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
        for policy in ("all", "last", "none"):
            wait_for(lambda: _fired(client, policy) >= 3, 60, f"{policy} to fire")
    stopped = _shutdown_and_restart(bc, outage_s=6)
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
        restarted = time.time()
        for policy in ("all", "last", "none"):
            wait_for(
                lambda: (client.schedules(policy)[0]["last_ms"] or 0) >= restarted * S,
                60,
                f"{policy} to fire after the restart",
            )
        for policy in ("all", "last", "none"):
            client.pause_schedule(policy)  # nothing fires after this: the records and tasks agree
        records = {rec["name"]: rec for rec in client.schedules()}
        tasks = {policy: _tasks(client, policy) for policy in records}
    for policy, rec in records.items():
        by_occurrence = {_occurrence_ms(t["key"]): t for t in tasks[policy]}
        occurrences = sorted(by_occurrence)
        assert len(occurrences) == len(tasks[policy]) == rec["fired"], policy
        expected = list(range(occurrences[0], occurrences[-1] + S, S))
        missing = sorted(set(expected) - set(occurrences))
        assert len(missing) == rec["skipped"], (policy, missing, rec["skipped"])
        # The first occurrence fired after the outage, and how late it was submitted.
        after = [t for t in occurrences if t > stopped * S]
        first = after[0]
        late_ms = by_occurrence[first]["submitted_ms"] - first
        if policy == "all":
            assert not missing and late_ms > grace_ms, (policy, late_ms)
        elif policy == "last":
            # One gap, then the latest missed occurrence (late), then the recent ones.
            assert missing and late_ms > grace_ms, (policy, missing, late_ms)
            assert missing == list(range(missing[0], missing[-1] + S, S)) and first == missing[-1] + S
        else:
            assert missing and late_ms <= grace_ms + S, (policy, missing, late_ms)
            assert missing == list(range(missing[0], missing[-1] + S, S)) and first == missing[-1] + S
