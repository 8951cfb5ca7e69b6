"""Progress from a running task (`task.progress(fraction, note)`) on a real cluster (ZooKeeper, 3 bookies,
3 brokers), with a Python handler in a real Worker:

- before `cluster enable-feature task_progress` the handler's report is sent and dropped: its
  heartbeat is acknowledged, the task records nothing and no LeaseExtended in the log carries one;
- a bad report is a ValueError in the handler and a one-line bad_request on the wire;
- once enabled, a report shows in `task show` (its line and --json), `task list` (a PROGRESS column)
  and the HTTP API's task (`GET /v1/tasks/{id}`);
- a report made just after the leader's SIGKILL is recorded by the next leader; the task completes
  with its last progress kept, after one attempt;
- the log holds each report the broker acknowledged exactly once, in order: nothing lost across
  the failover, nothing duplicated by the worker sending it again.
"""

from __future__ import annotations

import json
import queue
import threading

import pytest

from broker.api.client import Client, ClientError
from broker.api.worker import Worker
from broker.state.events import decode_batch
from pipeline.history import cluster_entries
from pipeline.plan import ClusterAddress
from tests.support.harness import wait_for
from tests.support.http_api import Http, api_keys, start_api

pytestmark = [pytest.mark.integration]

LEASE_MS = 1500  # a heartbeat each 0.5 s


def _run(bc, *args, timeout: float = 90):
    return bc.procs.run([*args, "--zk", bc.zk_hosts, "--cluster", bc.cluster.name], timeout=timeout)


def _ok(result) -> str:
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    return result.stdout.decode()


def _logged_progress(bc, task_id: str) -> list[list]:
    """The progress of every committed LeaseExtended of ``task_id``, in log order."""
    return [
        ev["progress"]
        for _ledger, _entry, _, payload in cluster_entries(ClusterAddress(bc.zk_hosts, bc.cluster.name))
        for ev in decode_batch(payload)
        if ev["type"] == "LeaseExtended" and ev["task_id"] == task_id and ev["progress"] is not None
    ]


def _enable(bc, client: Client) -> None:
    """Enable task_progress and wait until the leader records a probe's progress (it reads a watch)."""
    _ok(_run(bc, "cluster", "enable-feature", "task_progress", "--json"))
    probe = client.submit("probe", b"p")
    [leased] = client.call("lease", worker="probe-w", queues=["probe"], max_tasks=1, lease_ms=60_000)["tasks"]
    assert leased["task_id"] == probe

    def recorded() -> bool:
        client.call("heartbeat", worker="probe-w", task_id=probe, attempt=leased["attempt"], progress=1.0)
        return "progress" in client.get(probe)

    wait_for(recorded, 30, "the leader to see task_progress enabled")


@pytest.mark.timeout(300)
def test_progress_is_shown_survives_a_leader_sigkill_and_is_logged_once(broker_cluster, procs, tmp_path):
    bc = broker_cluster
    keys_file = tmp_path / "api.keys"
    producer = api_keys(keys_file, producer="shop")["producer"]
    http = Http(start_api(procs, bc, keys_file).address)
    reports: queue.Queue = queue.Queue()
    seen: dict = {}

    def handler(task):
        seen["task"] = task
        while True:
            report = reports.get(timeout=200)
            if report is None:
                return b"finished"
            try:
                task.progress(*report)
            except ValueError as exc:
                seen.setdefault("errors", []).append(str(exc))

    def sent(report) -> bool:
        """The worker's heartbeat carrying ``report`` was acknowledged."""
        slot = seen["task"].reported
        return slot.latest == [float(report[0]), report[1]] and slot.pending() is None

    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
        task_id = client.submit("prog", b"x")
        worker = Worker(
            zk=bc.zk_hosts,
            cluster=bc.cluster.name,
            queues=["prog"],
            lease_ms=LEASE_MS,
            handlers={"prog": handler},
            handle_signals=False,
        )
        runner = threading.Thread(target=worker.run, daemon=True)
        runner.start()
        try:
            wait_for(lambda: "task" in seen, 60, "the handler to start")
            attempt = seen["task"].attempt

            # Flag off: sent, acknowledged, dropped.
            reports.put((0.1, "before the flag"))
            wait_for(lambda: sent((0.1, "before the flag")), 30, "the report's heartbeat")
            assert "progress" not in client.get(task_id)

            # Bad reports: a ValueError in the handler, a one-line bad_request on the wire.
            reports.put((1.5, ""))
            reports.put((0.5, "x" * 201))
            wait_for(lambda: len(seen.get("errors", [])) == 2, 30, "the handler's ValueErrors")
            assert "0.0 to 1.0" in seen["errors"][0] and "at most 200" in seen["errors"][1]
            for fields, needle in (({"progress": 2}, "0.0 to 1.0"), ({"note": "n"}, "needs a progress")):
                with pytest.raises(ClientError) as refused:
                    client.call("heartbeat", worker="w", task_id=task_id, attempt=attempt, **fields)
                assert refused.value.code == "bad_request" and needle in str(refused.value)
                assert "\n" not in str(refused.value)

            _enable(bc, client)
            reports.put((0.5, "half"))
            wait_for(lambda: client.get(task_id).get("progress"), 30, "the progress to be recorded")
            assert client.get(task_id)["progress"] == {"fraction": 0.5, "note": "half", "attempt": attempt}
            wait_for(lambda: sent((0.5, "half")), 30, "the worker to hear the report was recorded")
            shown = json.loads(_ok(_run(bc, "task", "show", task_id, "--json")))
            assert shown["progress"] == {"fraction": 0.5, "note": "half", "attempt": attempt}
            assert "progress     50% half" in _ok(_run(bc, "task", "show", task_id))
            listed = _ok(_run(bc, "task", "list", "--queue", "prog")).splitlines()
            assert listed[0].split()[6:8] == ["PROGRESS", "ERROR"] and "50% half" in listed[1], listed
            listed_json = json.loads(_ok(_run(bc, "task", "list", "--queue", "prog", "--json")))
            assert listed_json["tasks"][0]["progress"]["fraction"] == 0.5
            status, doc, _ = http.request("GET", f"/v1/tasks/{task_id}", key=producer)
            assert status == 200 and doc["progress"] == {"fraction": 0.5, "note": "half", "attempt": attempt}

            old = bc.leader_proc()
            old_id = bc.wait_leader()["broker_id"]
            old.kill()
            reports.put((0.75, "after the failover"))
            wait_for(
                lambda: client.get(task_id).get("progress", {}).get("fraction") == 0.75,
                90,
                "the next leader to record the progress",
            )
            bc.wait_leader(timeout=60, not_id=old_id)
            bc.brokers[bc.brokers.index(old)] = bc.procs.restart(old)
            wait_for(lambda: sent((0.75, "after the failover")), 30, "the worker to hear it was recorded")

            reports.put(None)
            wait_for(lambda: client.get(task_id)["state"] == "done", 60, "the task to complete")
            task = client.get(task_id)
            assert task["attempts"] == 1 and task["result"] == b"finished", task
            assert task["progress"] == {"fraction": 0.75, "note": "after the failover", "attempt": attempt}
        finally:
            reports.put(None)
            worker.stop()
            runner.join(30)
            http.close()
        assert _logged_progress(bc, task_id) == [[0.5, "half"], [0.75, "after the failover"]]


@pytest.mark.timeout(240)
def test_a_worker_run_command_reports_progress_on_its_stderr(broker_cluster, tmp_path):
    bc = broker_cluster
    flag = tmp_path / "go"
    script = 'echo "FENCEPOST_PROGRESS 0.4 copying files" >&2; while [ ! -e "$0" ]; do sleep 0.05; done; cat'
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
        _enable(bc, client)
        task_id = client.submit("cmd", b"out")
        worker = bc.procs.start(
            "worker",
            ["worker", "run", "--queue", "cmd", "--lease-ms", str(LEASE_MS), "--zk", bc.zk_hosts,
             "--cluster", bc.cluster.name, "--", "sh", "-c", script, str(flag)],
        )  # fmt: skip
        try:
            wait_for(lambda: client.get(task_id).get("progress"), 60, "the command's progress")
            task = client.get(task_id)
            assert task["state"] == "running" and task["progress"]["fraction"] == 0.4, task
            assert task["progress"]["note"] == "copying files"
            flag.touch()
            wait_for(lambda: client.get(task_id)["state"] == "done", 60, "the command to finish")
            assert client.get(task_id)["result"] == b"out"
        finally:
            worker.terminate()
