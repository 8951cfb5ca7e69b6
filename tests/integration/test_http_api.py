"""The HTTP API (`fencepost api`) against a real cluster, through a real HTTP client over loopback.

Every endpoint with its answers; what it refuses and how (bad JSON, wrong types, oversized bodies,
missing and wrong keys, a role outside its rights with nothing changed, a key over its rate); and a
leader SIGKILLed while keyed submits go through the API: each is answered once, the same id comes
back when it is sent again, and no task is lost.
"""

from __future__ import annotations

import base64
import threading
import time

import pytest

from broker.api.client import Client
from election.wire import codes
from tests.support.harness import wait_for
from tests.support.http_api import Http, api_keys, start_api

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def api(broker_cluster, procs, tmp_path):
    keys_file = tmp_path / "api.keys"
    keys = api_keys(keys_file, producer="shop", worker="thumbs", admin="ops")
    proc = start_api(procs, broker_cluster, keys_file, extra=["--max-body-bytes", "4096"])
    http = Http(proc.address)
    yield broker_cluster, proc, http, keys
    http.close()


def _client(bc) -> Client:
    return Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=30)


def test_submit_get_wait_cancel_retry_and_the_listings(api):
    bc, _proc, http, keys = api
    producer, admin = keys["producer"], keys["admin"]
    status, doc, _ = http.request("POST", "/v1/queues/mail/tasks", {"payload": "hello"}, key=producer)
    assert status == 201, doc
    first = doc["task_id"]
    options = {
        "payload_b64": base64.b64encode(b"\xff\x00bin").decode(),
        "key": "order-7",
        "priority": 5,
        "max_attempts": 1,
        "max_run": 30,
        "retry_backoff": 0.5,
        "retry_backoff_max": 2,
    }
    status, doc, _ = http.request("POST", "/v1/queues/mail/tasks", options, key=producer)
    assert status == 201, doc
    keyed = doc["task_id"]
    status, again, _ = http.request("POST", "/v1/queues/mail/tasks", options, key=producer)
    assert (status, again["task_id"]) == (201, keyed)  # the same key: the same task

    status, task, headers = http.request("GET", f"/v1/tasks/{first}", key=producer)
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert (task["id"], task["queue"], task["state"], task["payload"], task["final"]) == (
        first,
        "mail",
        "waiting",
        "hello",
        False,
    )
    status, task, _ = http.request("GET", f"/v1/tasks/{keyed}", key=keys["worker"])
    assert status == 200 and base64.b64decode(task["payload_b64"]) == b"\xff\x00bin"
    assert task["priority"] == 5 and task["max_attempts"] == 1 and "payload" not in task

    # The long poll: a waiting task comes back as it is once the timeout passes...
    started = time.monotonic()
    status, task, _ = http.request("GET", f"/v1/tasks/{first}/wait?timeout=0.5", key=producer)
    assert status == 200 and task["state"] == "waiting" and not task["final"]
    assert time.monotonic() - started >= 0.45
    # ... and a task finished while it waits comes back at once, done, with its result.
    with _client(bc) as client:
        done = {}

        def wait() -> None:
            done["answer"] = Http(http.host + f":{http.port}").request(
                "GET", f"/v1/tasks/{first}/wait?timeout=30", key=producer
            )

        waiter = threading.Thread(target=wait)
        waiter.start()
        leased = client.call("lease", worker="w", queues=["mail"], max_tasks=2, wait_ms=0)["tasks"]
        by_id = {t["task_id"]: t for t in leased}
        client.call("complete", task_id=first, attempt=by_id[first]["attempt"], result="HELLO".encode())
        client.call("fail", task_id=keyed, attempt=by_id[keyed]["attempt"], error="boom")
        waiter.join(30)
        status, task, _ = done["answer"]
        assert status == 200 and task["state"] == "done" and task["result"] == "HELLO" and task["final"]

        # Retry: the dead task goes back to waiting (admin only).
        assert wait_for(lambda: client.get(keyed)["state"] == "dead", 10, "the failed task to die")
        status, doc, _ = http.request("POST", f"/v1/tasks/{keyed}/retry", key=admin)
        assert status == 200 and doc["task_id"] == keyed and doc["state"] == "waiting", doc
        assert client.get(keyed)["state"] == "waiting"

        # Cancel a waiting task; a second cancel is fine; a done one cannot be cancelled (409).
        status, doc, _ = http.request(
            "POST", "/v1/queues/later/tasks", {"payload": "x", "delay": 600}, key=producer
        )
        later = doc["task_id"]
        for _ in range(2):
            status, doc, _ = http.request("DELETE", f"/v1/tasks/{later}", key=producer)
            assert (status, doc) == (200, {"task_id": later, "cancelled": True})
        assert client.get(later)["state"] == "cancelled"
        status, doc, _ = http.request("DELETE", f"/v1/tasks/{first}", key=producer)
        assert status == 409 and doc["error"] == codes.E_BAD_STATE

    # The listings: pages of two with a cursor, filters, and the queues with their counts.
    for i in range(3):
        http.request("POST", "/v1/queues/pages/tasks", {"payload": f"p{i}"}, key=producer)
    seen, after = [], ""
    while True:
        status, doc, _ = http.request("GET", f"/v1/tasks?queue=pages&limit=2&after={after}", key=admin)
        assert status == 200 and len(doc["tasks"]) <= 2
        seen += [t["payload"] if "payload" in t else t["id"] for t in doc["tasks"]]
        if doc["next"] is None:
            break
        after = doc["next"]
    assert len(seen) == 3
    status, doc, _ = http.request("GET", "/v1/tasks?state=cancelled", key=admin)
    assert status == 200 and [t["id"] for t in doc["tasks"]] == [later]
    status, doc, _ = http.request("GET", "/v1/queues", key=admin)
    counts = {q["queue"]: q["counts"] for q in doc["queues"]}
    assert counts["pages"].get("waiting") == 3 and counts["later"].get("cancelled") == 1, counts

    status, doc, _ = http.request("GET", "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.") and "/v1/queues/{queue}/tasks" in doc["paths"]


def test_bad_bodies_wrong_types_oversized_unknown_paths_and_tasks(api):
    bc, _proc, http, keys = api
    producer = keys["producer"]
    post = "/v1/queues/mail/tasks"
    cases = [
        (b'{"payload": "x"', 400, codes.E_MALFORMED),
        (b"\xff\xfe not utf-8", 400, codes.E_MALFORMED),
        (b'["payload"]', 400, codes.E_BAD_REQUEST),
        (b'{"payload": 7}', 400, codes.E_BAD_REQUEST),
        (b'{"payload": "x", "priority": "high"}', 400, codes.E_BAD_REQUEST),
        (b'{"payload": "x", "priority": true}', 400, codes.E_BAD_REQUEST),
        (b'{"payload": "x", "delay": -1}', 400, codes.E_BAD_REQUEST),
        (b'{"payload": "x", "max_attempts": 1.5}', 400, codes.E_BAD_REQUEST),
        (b'{"payload": "x", "colour": "red"}', 400, codes.E_BAD_REQUEST),
        (b'{"payload": "x", "payload_b64": "eA=="}', 400, codes.E_BAD_REQUEST),
        (b'{"payload_b64": "not base64!"}', 400, codes.E_BAD_REQUEST),
        (b"{}", 400, codes.E_BAD_REQUEST),
        (b'{"payload": "' + b"x" * 5000 + b'"}', 413, codes.E_OVERSIZED),
    ]
    for raw, status, code in cases:
        got, doc, _ = http.request("POST", post, key=producer, raw=raw)
        assert (got, doc["error"]) == (status, code), (raw[:40], doc)
        assert doc["message"]
    got, doc, _ = http.request("POST", "/v1/queues/bad%20queue/tasks", {"payload": "x"}, key=producer)
    assert (got, doc["error"]) == (400, codes.E_INVALID_QUEUE)
    got, doc, _ = http.request("GET", "/v1/tasks/00000000000000000000000000000000", key=producer)
    assert (got, doc["error"]) == (404, codes.E_NO_SUCH_TASK)
    got, doc, _ = http.request("GET", "/v1/tasks/x/wait?timeout=soon", key=producer)
    assert (got, doc["error"]) == (400, codes.E_BAD_REQUEST)
    got, doc, _ = http.request("GET", "/v1/nothing", key=producer)
    assert (got, doc["error"]) == (404, "not_found")
    got, doc, _ = http.request("PUT", "/v1/queues", key=producer)
    assert (got, doc["error"]) == (405, "method_not_allowed")
    with _client(bc) as client:  # none of it made a task
        assert client.queues()["queues"] == []


def test_missing_and_wrong_keys_are_401_and_a_role_outside_its_rights_is_403_with_nothing_changed(
    api, tmp_path
):
    bc, _proc, http, keys = api
    post = "/v1/queues/mail/tasks"
    for headers in ({}, {"Authorization": "Basic b3BzOnB3"}, {"Authorization": "Bearer"}):
        got, doc, _ = http.request("POST", post, {"payload": "x"}, headers=headers)
        assert (got, doc["error"]) == (401, "unauthorized"), headers
    wrong = "fpk_" + "A" * 43
    got, doc, _ = http.request("POST", post, {"payload": "x"}, key=wrong)
    assert (got, doc["error"]) == (401, "unauthorized") and wrong not in doc["message"]

    with _client(bc) as client:
        task_id = client.submit("mail", b"kept")
        before = client.queues()
        refused = [
            ("POST", post, {"payload": "x"}, keys["worker"]),
            ("DELETE", f"/v1/tasks/{task_id}", None, keys["worker"]),
            ("POST", f"/v1/tasks/{task_id}/retry", None, keys["producer"]),
            ("GET", "/v1/tasks", None, keys["producer"]),
            ("GET", "/v1/queues", None, keys["worker"]),
        ]
        for method, path, body, key in refused:
            got, doc, _ = http.request(method, path, body, key=key)
            assert (got, doc["error"]) == (403, codes.E_FORBIDDEN), (method, path)
        assert client.queues() == before
        assert client.get(task_id)["state"] == "waiting"
        tasks, _ = client.list_tasks(queue="mail")
        assert [t["id"] for t in tasks] == [task_id]


def test_sigterm_stops_the_api_with_exit_0_and_a_taken_address_is_one_line_naming_it(api, procs, tmp_path):
    bc, proc, http, keys = api
    assert http.request("GET", "/v1/tasks/x", key=keys["producer"])[0] == 404
    http.close()
    second = procs.run(
        [
            "api",
            "--listen",
            proc.address,
            "--api-keys-file",
            str(tmp_path / "api.keys"),
            "--zk",
            bc.zk_hosts,
            "--cluster",
            bc.cluster.name,
        ]
    )
    assert second.returncode == 1 and not second.stdout
    assert second.stderr.decode().splitlines() == [
        f"fencepost: cannot serve the HTTP API on {proc.address}: Address already in use"
    ]
    # uvicorn raises SIGTERM again after its graceful stop: the API's own handler makes that harmless.
    assert proc.terminate() == 0, proc.output()[-3000:]
    assert "Traceback" not in proc.output()


def test_a_key_over_its_rate_is_429_with_retry_after(broker_cluster, procs, tmp_path):
    keys = api_keys(tmp_path / "api.keys", producer="shop", admin="ops")
    proc = start_api(
        procs, broker_cluster, tmp_path / "api.keys", extra=["--rate-limit", "0.2", "--burst", "2"]
    )
    http = Http(proc.address)
    answers = [http.request("GET", "/v1/tasks/x", key=keys["producer"]) for _ in range(3)]
    assert [a[0] for a in answers] == [404, 404, 429]
    assert answers[2][1]["error"] == "rate_limited" and int(answers[2][2]["retry-after"]) >= 1
    # The limit is per key: another key still gets in.
    assert http.request("GET", "/v1/tasks/x", key=keys["admin"])[0] == 404
    http.close()


def test_keyed_submits_through_the_api_survive_a_leader_sigkill_each_answered_once(
    broker_cluster, procs, tmp_path
):
    bc = broker_cluster
    keys = api_keys(tmp_path / "api.keys", producer="shop", admin="ops")
    proc = start_api(procs, bc, tmp_path / "api.keys")
    answers: dict[str, list] = {}  # key -> every answer its one request got
    stop = threading.Event()
    lock = threading.Lock()

    def produce(n: int) -> None:
        http = Http(proc.address)
        i = 0
        while not stop.is_set():
            key = f"t{n}-{i}"
            try:
                status, doc, _ = http.request(
                    "POST", "/v1/queues/orders/tasks", {"payload": key, "key": key}, key=keys["producer"]
                )
                answer = (status, doc.get("task_id") or doc.get("error"))
            except OSError as exc:  # the API itself failed this request: counted against it below
                answer = ("no answer", repr(exc))
            with lock:
                answers.setdefault(key, []).append(answer)
            i += 1
        http.close()

    def answered() -> int:
        with lock:
            return len(answers)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: answered() >= 100, 60, "100 submits through the API")
        old = bc.leader_info()
        bc.leader_proc().kill()
        at_kill = answered()
        bc.wait_leader(not_id=old["broker_id"])
        wait_for(lambda: answered() >= at_kill + 100, 90, "100 more submits after the failover")
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)

    assert all(len(got) == 1 for got in answers.values())  # each request answered exactly once
    failed = {key: got for key, got in answers.items() if got[0][0] != 201}
    assert not failed, list(failed.items())[:5]
    ids = {key: got[0][1] for key, got in answers.items()}
    assert len(set(ids.values())) == len(ids)
    http = Http(proc.address)
    for key, task_id in ids.items():  # sent again: the same task
        status, doc, _ = http.request(
            "POST", "/v1/queues/orders/tasks", {"payload": key, "key": key}, key=keys["producer"]
        )
        assert (status, doc["task_id"]) == (201, task_id), key
    status, doc, _ = http.request("GET", "/v1/queues", key=keys["admin"])
    [orders] = [q for q in doc["queues"] if q["queue"] == "orders"]
    assert orders["counts"]["waiting"] == len(ids)  # nothing lost, nothing twice
    http.close()
