"""`fencepost submit`, `task show` and `worker run -- CMD` against a real cluster."""

import json
import time

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_submit_worker_run_and_task_show(broker_cluster, procs):
    bc = broker_cluster
    target = ["--zk", bc.zk_hosts, "--cluster", bc.cluster.name]
    ok = procs.run(["submit", "shout", "hello", *target])
    assert ok.returncode == 0, ok.stderr.decode()
    task_id = ok.stdout.decode().strip()
    bad = procs.run(["submit", "shout", *target], input=b"boom")
    fails = bad.stdout.decode().strip()
    script = "import sys; d=sys.stdin.read(); sys.exit(3) if d=='boom' else print(d.upper(), end='')"
    worker = procs.start(
        "worker", ["worker", "run", "--queue", "shout", *target, "--", "python3", "-c", script]
    )
    deadline = time.monotonic() + 60
    while True:
        shown = procs.run(["task", "show", task_id, "--json", *target])
        assert shown.returncode == 0, shown.stderr.decode()
        info = json.loads(shown.stdout)
        if info["state"] == "done" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert info["state"] == "done" and info["result"] == "HELLO"
    while True:
        failed = json.loads(procs.run(["task", "show", fails, "--json", *target]).stdout)
        if failed["state"] == "dead" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert failed["state"] == "dead" and failed["attempts"] == 3
    assert "status 3" in failed["error"]
    worker.terminate()


def test_task_show_unknown_id_fails_with_one_line(broker_cluster, procs):
    result = procs.run(
        ["task", "show", "nope", "--zk", broker_cluster.zk_hosts, "--cluster", broker_cluster.cluster.name]
    )
    assert result.returncode == 1
    assert result.stderr.decode().count("\n") == 1 and "nope" in result.stderr.decode()


def test_task_cancel_from_the_cli(broker_cluster, procs):
    target = ["--zk", broker_cluster.zk_hosts, "--cluster", broker_cluster.cluster.name]
    task_id = procs.run(["submit", "later", "x", "--delay", "60", *target]).stdout.decode().strip()
    cancelled = procs.run(["task", "cancel", task_id, *target])
    assert cancelled.returncode == 0, cancelled.stderr.decode()
    shown = json.loads(procs.run(["task", "show", task_id, "--json", *target]).stdout)
    assert shown["state"] == "cancelled"
    again = procs.run(["task", "cancel", "no-such-task", *target])
    assert again.returncode == 1
