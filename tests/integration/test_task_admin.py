"""Finding and acting on tasks, queues and workers on real clusters: `task list|retry`, `queue list|purge|
requeue-dead`, `worker list`, across a SIGKILL of the leader; workers seen and lost; result_ttl purges."""

from __future__ import annotations

import json

import pytest

from broker.api.client import Client, TaskNotFound
from tests.support.harness import BrokerCluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def make_dead(client: Client, queue: str, n: int) -> list[str]:
    """``n`` tasks of ``queue`` that fail their only attempt: dead."""
    ids = [client.submit(queue, f"p{i}".encode(), max_attempts=1) for i in range(n)]
    leased = client.call("lease", worker="maker", queues=[queue], max_tasks=n)["tasks"]
    for task in leased:
        client.call("fail", task_id=task["task_id"], attempt=task["attempt"], error=f"boom {task['task_id']}")
    assert sorted(t["task_id"] for t in leased) == sorted(ids)
    return ids


def cli_json(procs, args: list[str], target: list[str]):
    done = procs.run([*args, "--json", *target])
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


def test_dead_tasks_are_listed_retried_requeued_and_purged_across_a_leader_sigkill(broker_cluster, procs):
    bc = broker_cluster
    target = ["--zk", bc.zk_hosts, "--cluster", bc.cluster.name]
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=30) as client:
        jobs = make_dead(client, "jobs", 5)
        other = make_dead(client, "other", 2)
        client.submit("jobs", b"waiting")
        pages, after = [], None
        while True:  # two at a time through the CLI: every dead task of jobs once, in submit order
            page = cli_json(
                procs,
                ["task", "list", "--queue", "jobs", "--state", "dead", "--limit", "2"]
                + (["--after", after] if after else []),
                target,
            )
            pages.append([t["id"] for t in page["tasks"]])
            after = page["next"]
            if after is None:
                break
        assert sum(pages, []) == jobs and [len(p) for p in pages] == [2, 2, 1]

        old_leader = bc.leader_info()["broker_id"]
        bc.leader_proc().kill()
        bc.wait_leader(not_id=old_leader)
        dead = client.list_tasks(state="dead", limit=100)[0]
        assert [t["id"] for t in dead] == jobs + other and dead[0]["error"] == f"boom {jobs[0]}"

        shown = procs.run(["task", "list", "--state", "dead", "--limit", "3", *target])
        assert shown.returncode == 0 and "more: fencepost task list --after" in shown.stderr.decode()
        assert shown.stdout.decode().split()[:7] == [
            "ID",
            "QUEUE",
            "STATE",
            "ATTEMPTS",
            "SUBMITTED",
            "FINISHED",
            "ERROR",
        ]
        retried = procs.run(["task", "retry", jobs[0], *target])
        assert retried.returncode == 0 and "waiting again" in retried.stdout.decode(), retried.stderr.decode()
        task = client.get(jobs[0])
        assert (task["state"], task["attempts"], task["attempt_base"]) == ("waiting", 1, 1)
        assert cli_json(procs, ["queue", "requeue-dead", "other"], target)["requeued"] == 2
        assert cli_json(procs, ["queue", "purge", "jobs", "--state", "dead"], target)["purged"] == 4
        with pytest.raises(TaskNotFound):
            client.get(jobs[1])
        queues = {q["queue"]: q["counts"] for q in cli_json(procs, ["queue", "list"], target)["queues"]}
        assert (queues["jobs"]["waiting"], queues["jobs"]["dead"]) == (2, 0)
        assert (queues["other"]["waiting"], queues["other"]["dead"]) == (2, 0)


def test_worker_list_shows_a_running_worker_then_loses_it_and_result_ttl_purges(cluster, procs):
    flags = ["--worker-seen-s", "0.5", "--worker-lost-s", "2", "--result-ttl-s", "3"]
    bookies = procs.start_bookies(cluster, 3)
    brokers = [procs.start_broker(cluster, extra=flags)]
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
    bc.wait_leader()
    target = ["--zk", bc.zk_hosts, "--cluster", cluster.name]
    with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=30) as client:
        client.declare_queue("keep", result_ttl=0)
        kept = client.submit("keep", b"k")
        [task] = client.call("lease", worker="maker", queues=["keep"])["tasks"]
        client.call("complete", task_id=kept, attempt=task["attempt"])
        worker = procs.start(
            "worker",
            ["worker", "run", "--queue", "shout", "--name", "w-test", *target, "--", "tr", "a-z", "A-Z"],
        )
        seen = wait_for(
            lambda: [w for w in client.workers() if w["worker"] == "w-test"], 30, "w-test in the list"
        )
        assert seen[0]["queues"] == ["shout"] and seen[0]["in_hand"] == 0
        done = client.submit("shout", b"hi")
        assert client.wait(done, timeout=30)["result"] == b"HI"
        listed = procs.run(["worker", "list", *target])
        assert (
            listed.returncode == 0
            and "w-test" in listed.stdout.decode()
            and "shout" in listed.stdout.decode()
        )

        worker.kill()
        wait_for(lambda: all(w["worker"] != "w-test" for w in client.workers()), 30, "w-test lost")
        # The done task of shout is purged 3 s after it finished (the brokers' result_ttl_s); keep's stays.
        wait_for(lambda: not client.list_tasks(queue="shout")[0], 30, "shout's done task purged")
        assert client.get(kept)["state"] == "done"
        assert client.queues()["result_ttl_ms"] == 3000
