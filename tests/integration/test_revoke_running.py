"""Revoking a running task (`task cancel --running`) on a real cluster (ZooKeeper, 3 bookies, 3 brokers).

- `task cancel --running` is refused (exit 1, one line naming `fencepost cluster enable-feature
  revoke_running`) until the flag is enabled; a plain `task cancel` of a running task is refused
  as before (bad_state, one line);
- a `worker run` child (a sleeping shell command) is killed with its process group within a bound
  after `task cancel --running --json`, sent just after a leader SIGKILL (the client retries it to
  the next leader); the task ends cancelled after one attempt and is never run again;
- a Python handler sees `task.cancelled` and gets `fencepost.Cancelled` at its next
  `task.heartbeat()`; whatever it returns then is dropped, and the revoked attempt's own complete
  is refused like a stale attempt and changes nothing;
- over HTTP, `DELETE /v1/tasks/{id}?running=true` is 409 feature_disabled before the flag and
  revokes the running task after it; another value of `running` is 400.
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from broker.api.client import Client, ClientError
from broker.api.revoke import Cancelled
from broker.api.worker import Worker
from tests.support.harness import wait_for
from tests.support.http_api import Http, api_keys, start_api

pytestmark = [pytest.mark.integration]

LEASE_MS = 1500
# The worker hears of the revoke on its next heartbeat (each LEASE_MS / 3); the rest is slack
# for a loaded machine and for the heartbeat finding the new leader.
KILL_BOUND_S = 15.0
SLEEPER = 'echo $$ > "$0"; sleep 600'


def _run(bc, *args, timeout: float = 90):
    return bc.procs.run([*args, "--zk", bc.zk_hosts, "--cluster", bc.cluster.name], timeout=timeout)


def _ok(result) -> dict:
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    return json.loads(result.stdout)


def _one_line_error(result, *needles: str) -> str:
    err = result.stderr.decode()
    assert result.returncode == 1, result.stdout.decode() + err
    assert err.count("\n") == 1 and all(n in err for n in needles), err
    return err


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _enable(bc, client: Client) -> None:
    _ok(_run(bc, "cluster", "enable-feature", "revoke_running", "--json"))
    probe = client.submit("probe", b"p")
    # The leader reads the flag from a watch: wait until it accepts the option.
    wait_for(
        lambda: _run(bc, "task", "cancel", probe, "--running", "--json").returncode == 0,
        30,
        "the leader to see revoke_running enabled",
    )


@pytest.mark.timeout(300)
def test_a_worker_run_child_is_killed_after_cancel_running_across_a_leader_sigkill(broker_cluster, tmp_path):
    bc = broker_cluster
    pid_file = tmp_path / "pid"
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
        task_id = client.submit("jobs", b"", key="sleeper")
        worker = bc.procs.start(
            "worker",
            ["worker", "run", "--queue", "jobs", "--lease-ms", str(LEASE_MS), "--zk", bc.zk_hosts,
             "--cluster", bc.cluster.name, "--", "sh", "-c", SLEEPER, str(pid_file)],
        )  # fmt: skip
        pgid = int(
            wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 60, "the command's pid")
        )
        assert client.get(task_id)["state"] == "running"
        _one_line_error(_run(bc, "task", "cancel", task_id, "--running"), "revoke_running", "enable-feature")
        _one_line_error(_run(bc, "task", "cancel", task_id), "running")  # today's answer, without --running
        _enable(bc, client)
        assert client.get(task_id)["state"] == "running" and _group_alive(pgid)

        old = bc.leader_proc()
        old_id = bc.wait_leader()["broker_id"]
        old.kill()
        # Sent at once: the CLI's client retries it until the next leader answers.
        answer = _ok(_run(bc, "task", "cancel", task_id, "--running", "--json"))
        assert answer == {"task_id": task_id, "state": "cancelled"}
        cancelled_at = time.monotonic()
        wait_for(lambda: not _group_alive(pgid), KILL_BOUND_S, "the command's process group to be killed")
        assert time.monotonic() - cancelled_at < KILL_BOUND_S
        bc.wait_leader(timeout=60, not_id=old_id)
        bc.brokers[bc.brokers.index(old)] = bc.procs.restart(old)

        # A repeat (a client retrying after a lost reply) is answered the same and changes nothing.
        assert _ok(_run(bc, "task", "cancel", task_id, "--running", "--json"))["state"] == "cancelled"
        time.sleep(3 * LEASE_MS / 1000)  # past any lease the attempt had: nothing runs it again
        task = client.get(task_id)
        assert task["state"] == "cancelled" and task["attempts"] == 1 and task["result"] is None, task
        assert pid_file.read_text().strip() == str(pgid)  # the command never ran again
        assert worker.alive()
        counts = {q["queue"]: q["counts"] for q in client.queues()["queues"]}["jobs"]
        assert counts["running"] == 0 and counts["waiting"] == 0 and counts["cancelled"] == 1
    worker.terminate()
    assert "cancelled while in hand" in worker.output()


@pytest.mark.timeout(240)
def test_a_python_handler_gets_cancelled_at_its_next_heartbeat_and_its_late_complete_is_dropped(
    broker_cluster,
):
    bc = broker_cluster
    started, seen = threading.Event(), {}

    def handler(task):
        seen["attempt"] = task.attempt
        started.set()
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline:
                task.heartbeat()
                time.sleep(0.05)
        except Cancelled as exc:
            seen["cancelled"] = (task.cancelled, str(exc))
        return b"late"  # dropped: the task was revoked

    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
        _enable(bc, client)
        task_id = client.submit("py", b"x")
        worker = Worker(
            zk=bc.zk_hosts,
            cluster=bc.cluster.name,
            queues=["py"],
            lease_ms=LEASE_MS,
            handlers={"py": handler},
            handle_signals=False,
        )
        runner = threading.Thread(target=worker.run, daemon=True)
        runner.start()
        try:
            assert started.wait(60)
            client.cancel(task_id, running=True)
            wait_for(lambda: "cancelled" in seen, KILL_BOUND_S, "the handler to get Cancelled")
            assert seen["cancelled"][0] is True and task_id in seen["cancelled"][1]
            with pytest.raises(ClientError) as refused:
                client.call("complete", task_id=task_id, attempt=seen["attempt"], result=b"late")
            assert refused.value.code == "not_running"
            time.sleep(3 * LEASE_MS / 1000)
            task = client.get(task_id)
            assert task["state"] == "cancelled" and task["result"] is None and task["attempts"] == 1, task
        finally:
            worker.stop()
            runner.join(30)
        assert worker.stats["cancelled"] == 1


@pytest.mark.timeout(240)
def test_the_http_api_revokes_a_running_task_with_running_true(broker_cluster, procs, tmp_path):
    bc = broker_cluster
    keys_file = tmp_path / "api.keys"
    producer = api_keys(keys_file, producer="shop")["producer"]
    http = Http(start_api(procs, bc, keys_file).address)
    try:
        with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
            task_id = client.submit("web", b"x")
            [leased] = client.call("lease", worker="w", queues=["web"], max_tasks=1)["tasks"]
            assert leased["task_id"] == task_id
            status, doc, _ = http.request("DELETE", f"/v1/tasks/{task_id}?running=true", key=producer)
            assert status == 409 and doc["error"] == "feature_disabled", doc
            status, doc, _ = http.request("DELETE", f"/v1/tasks/{task_id}?running=maybe", key=producer)
            assert status == 400, doc
            _enable(bc, client)
            status, doc, _ = http.request("DELETE", f"/v1/tasks/{task_id}?running=true", key=producer)
            assert (status, doc) == (200, {"task_id": task_id, "cancelled": True})
            assert client.get(task_id)["state"] == "cancelled"
    finally:
        http.close()
