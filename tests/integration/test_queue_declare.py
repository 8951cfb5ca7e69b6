"""`fencepost queue declare` and `queue show` on a real cluster: the declared settings are shown and
acted on (a failed task waits the declared backoff, capped; its attempts end at the declared
max; a lease carries the declared max run; finished tasks go after the declared TTL), the
cluster's defaults fill what a queue leaves unset, and bad values are refused with exit 2 and
one line, changing nothing."""

from __future__ import annotations

import json

import pytest

from broker.api.client import Client
from election.leader import read_leader
from election.shards import shard_of_key, shard_of_task
from tests.support.harness import BrokerCluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

# The brokers' own default for queues that set no result TTL: an hour, so a declared one is told apart.
CLUSTER_TTL_S = 3600
# The settings of the expiry, length-limit and rate-limit flags, none of them declared here.
UNDECLARED_LIMITS = {
    "expires_ms": None,
    "max_waiting": None,
    "overflow": None,
    "rate": None,
    "max_running": None,
}


def cli(procs, target: list[str], *args: str) -> str:
    done = procs.run([*args, *target], timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def cli_json(procs, target: list[str], *args: str) -> dict:
    return json.loads(cli(procs, target, *args, "--json"))


def lease_one(client: Client, queue: str) -> dict:
    """The next lease of ``queue``, waiting out its retry backoff."""

    def leased() -> dict | None:
        tasks = client.call("lease", worker="tester", queues=[queue], wait_ms=500)["tasks"]
        return tasks[0] if tasks else None

    return wait_for(leased, 30, f"a task of {queue} to lease")


@pytest.fixture
def one_broker(cluster, procs) -> BrokerCluster:
    bookies = procs.start_bookies(cluster, 3, fsync=False)
    brokers = [procs.start_broker(cluster, extra=["--result-ttl-s", str(CLUSTER_TTL_S)])]
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
    bc.wait_leader()
    return bc


def test_declared_settings_are_shown_and_acted_on(one_broker, procs):
    bc = one_broker
    target = ["--zk", bc.zk_hosts, "--cluster", bc.cluster.name]
    declared = cli_json(
        procs,
        target,
        *("queue", "declare", "mail", "--max-attempts", "3", "--retry-backoff", "1.5s"),
        *("--retry-backoff-max", "2", "--max-run", "20s", "--result-ttl", "0"),
    )
    assert declared == {
        "queue": "mail",
        "created": True,
        "settings": {
            "max_attempts": 3,
            "max_run_ms": 20_000,
            "retry_backoff_ms": 1500,
            "retry_backoff_max_ms": 2000,
            "result_ttl_ms": 0,
            **UNDECLARED_LIMITS,
        },
    }
    shown = cli_json(procs, target, "queue", "show", "mail")
    assert shown["settings"] == declared["settings"]
    assert shown["effective"] == {**declared["settings"], "overflow": "reject"}
    assert shown["defaults"] == {
        "max_run_ms": None,
        "expires_ms": None,
        "max_waiting": None,
        "overflow": "reject",
        "rate": None,
        "max_running": None,
        "retry_backoff_ms": 1000,
        "retry_backoff_max_ms": 300_000,
        "result_ttl_ms": CLUSTER_TTL_S * 1000,
    }
    assert set(shown["counts"].values()) == {0}

    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=30) as client:
        task_id = client.submit("mail", b"x")
        delays, attempts = [], []
        while True:
            lease = lease_one(client, "mail")
            assert lease["task_id"] == task_id and lease["max_run_ms"] == 20_000
            attempts.append(lease["attempt"])
            failed = client.call("fail", task_id=task_id, attempt=lease["attempt"], error="boom")
            if not failed["will_retry"]:
                break
            delays.append(failed["retry_delay_ms"])
        # 1.5 s, then twice that capped at the declared 2 s; the third attempt is the last.
        assert (delays, attempts) == ([1500, 2000], [1, 2, 3])
        assert client.get(task_id)["state"] == "dead"
        # A task's own submit option still wins over its queue's.
        own = client.submit("mail", b"own", retry_backoff=0.25)
        lease = lease_one(client, "mail")
        assert lease["task_id"] == own
        assert client.call("fail", task_id=own, attempt=lease["attempt"])["retry_delay_ms"] == 250

        shown = cli_json(procs, target, "queue", "show", "mail")
        listed = next(q for q in client.queues()["queues"] if q["queue"] == "mail")
        assert shown["counts"]["dead"] == 1
        assert all(shown["counts"][state] == listed["counts"].get(state, 0) for state in shown["counts"])

        # A second declaration changes what it names and keeps the rest.
        changed = cli_json(procs, target, "queue", "declare", "mail", "--retry-backoff", "0")
        assert changed["created"] is False
        assert changed["settings"] == {**declared["settings"], "retry_backoff_ms": 0}

        # A declared TTL purges the queue's finished tasks; the queue declaring 0 keeps its dead one.
        cli(procs, target, "queue", "declare", "brief", "--result-ttl", "1s")
        assert cli_json(procs, target, "queue", "show", "brief")["effective"]["result_ttl_ms"] == 1000
        brief = client.submit("brief", b"b")
        lease = lease_one(client, "brief")
        client.call("complete", task_id=brief, attempt=lease["attempt"])
        wait_for(lambda: not client.list_tasks(queue="brief")[0], 30, "brief's done task purged")
        assert client.get(task_id)["state"] == "dead"


def test_show_says_which_values_are_the_cluster_s_and_bad_values_are_refused(one_broker, procs):
    bc = one_broker
    target = ["--zk", bc.zk_hosts, "--cluster", bc.cluster.name]
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=30) as client:
        client.submit("plain", b"x", delay=600)
    # A queue made by a submit declares nothing: the cluster's values, marked as such.
    lines = cli(procs, target, "queue", "show", "plain").splitlines()
    assert lines[0].split() == ["queue", "plain"]
    assert lines[1].split() == ["max_attempts", "3"]
    assert lines[2].split() == ["max_run", "none", "(not", "set)"]
    assert lines[3].split() == ["retry_backoff", "1s", "(cluster", "default)"]
    assert lines[4].split() == ["retry_backoff_max", "5m", "(cluster", "default)"]
    assert lines[5].split() == ["result_ttl", "1h", "(cluster", "default)"]
    assert lines[6].split() == ["expires", "none", "(not", "set)"]
    assert lines[7].split() == ["max_waiting", "none", "(not", "set)"]
    assert lines[8].split() == ["overflow", "reject", "(cluster", "default)"]
    assert lines[9].split() == ["rate", "none", "(not", "set)"]
    assert lines[10].split() == ["max_running", "none", "(not", "set)"]
    header = ["WAITING", "DELAYED", "RUNNING", "DONE", "FAILED", "DEAD", "CANCELLED", "EXPIRED"]
    assert lines[11].split() == header
    counts = dict(zip(lines[11].split(), map(int, lines[12].split())))
    assert (counts["DELAYED"], counts["RUNNING"], counts["DONE"]) == (1, 0, 0)

    human = cli(procs, target, "queue", "declare", "plain", "--retry-backoff", "90", "--result-ttl", "7d")
    assert human.splitlines()[0] == "updated queue plain"
    assert "retry_backoff      90s" in human and "result_ttl         7d" in human

    for args, named in (
        (["--retry-backoff", "-1"], "--retry-backoff"),
        (["--max-run", "0.01"], "--max-run"),
        (["--max-attempts", "0"], "--max-attempts"),
        (["--result-ttl", "soon"], "--result-ttl"),
    ):
        refused = procs.run(["queue", "declare", "fresh", *args, *target])
        err = refused.stderr.decode()
        assert refused.returncode == 2 and err.count("\n") == 1 and named in err, err
    bad_name = procs.run(["queue", "declare", "no spaces", *target])
    assert bad_name.returncode == 2 and bad_name.stderr.decode().count("\n") == 1

    # Nothing was declared by the refused commands: `queue show` knows no such queue (exit 1, one line).
    missing = procs.run(["queue", "show", "fresh", "--json", *target])
    assert missing.returncode == 1 and missing.stdout == b""
    err = missing.stderr.decode()
    assert err.count("\n") == 1 and "no queue 'fresh'" in err, err


@pytest.mark.timeout(300)
def test_a_declaration_covers_every_shard_and_show_sums_them(cluster, procs):
    shards = 2
    target = ["--zk", cluster.hosts, "--cluster", cluster.name]
    cli(procs, target, "cluster", "init", "--shards", str(shards))
    procs.start_bookies(cluster, 3, fsync=False)
    procs.wait_ready([procs.start_broker(cluster, ready=False)])
    wait_for(
        lambda: all(read_leader(cluster.zk, cluster.paths.of_shard(n)) for n in range(shards)),
        180,
        "a leader in every shard",
    )
    declared = cli_json(procs, target, "queue", "declare", "spread", "--retry-backoff", "1.25s")
    assert declared["settings"]["retry_backoff_ms"] == 1250
    keys = {}
    for i in range(1000):
        keys.setdefault(shard_of_key(f"k{i}", shards), f"k{i}")
        if len(keys) == shards:
            break
    with Client(zk=cluster.hosts, cluster=cluster.name, timeout=60) as client:
        for shard, key in sorted(keys.items()):
            task_id = client.submit("spread", b"x", key=key)
            assert shard_of_task(task_id) == shard

            def leased(shard: int = shard) -> dict | None:
                reply = client.call("lease", shard=shard, worker="tester", queues=["spread"], wait_ms=500)
                return reply["tasks"][0] if reply["tasks"] else None

            lease = wait_for(leased, 30, f"the task of shard {shard}")
            failed = client.call("fail", task_id=task_id, attempt=lease["attempt"])
            # Each shard's leader applies the queue's declared backoff: the declaration reached it.
            assert failed["retry_delay_ms"] == 1250, (shard, failed)
        shown = cli_json(procs, target, "queue", "show", "spread")
        listed = next(q for q in client.queues()["queues"] if q["queue"] == "spread")
    assert shown["effective"]["retry_backoff_ms"] == 1250
    assert all(shown["counts"][state] == listed["counts"].get(state, 0) for state in shown["counts"])
    assert sum(n for state, n in shown["counts"].items() if state != "delayed") == shards
