"""`fencepost dev up --api --json`: a dev cluster with its HTTP API, its address and admin key in cluster.json (also on a
secure cluster, where a request without the key is refused);
`dev down --json` stops it with the rest, and `dev up` over the stopped dev dir starts it again."""

from __future__ import annotations

import json

import pytest

from tests.support.devrun import dev
from tests.support.harness import wait_for
from tests.support.http_api import Http

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_dev_up_api_records_the_api_and_an_admin_key_and_dev_down_stops_it(tmp_path):
    dev_dir = str(tmp_path / "dev")
    try:
        state = json.loads(
            dev("up", "--dev-dir", dev_dir, "--bookies", "3", "--brokers", "2", "--api", "--json").stdout
        )
        assert state == json.loads((tmp_path / "dev" / "cluster.json").read_text())
        assert state["api"].startswith("127.0.0.1:") and state["api_key"].startswith("fpk_")
        assert state["api_key"] not in (tmp_path / "dev" / "api.keys").read_text()
        http = Http(state["api"])

        def submitted():
            status, doc, _ = http.request(
                "POST", "/v1/queues/mail/tasks", {"payload": "hi"}, key=state["api_key"]
            )
            return doc["task_id"] if status == 201 else None

        task_id = wait_for(submitted, 60, "a submit through the dev cluster's API")
        status, doc, _ = http.request("GET", "/v1/queues", key=state["api_key"])  # admin: every right
        assert status == 200 and doc["queues"][0]["queue"] == "mail"
        http.close()

        down = json.loads(dev("down", "--dev-dir", dev_dir, "--json").stdout)
        assert "api-0" in {m["name"] for m in down["stopped"]} and len(down["stopped"]) == 7

        again = json.loads(dev("up", "--dev-dir", dev_dir, "--json").stdout)
        assert again["api"] == state["api"] and again["api_key"] == state["api_key"]
        http = Http(state["api"])
        status, doc, _ = wait_for(
            lambda: (
                (got := http.request("GET", f"/v1/tasks/{task_id}", key=state["api_key"]))[0] == 200 and got
            ),
            60,
            "the task through the restarted API",
        )
        assert doc["payload"] == "hi"
        http.close()
    finally:
        dev("down", "--dev-dir", dev_dir)


def test_a_secure_dev_cluster_with_the_api_serves_the_recorded_key_and_refuses_requests_without_it(tmp_path):
    dev_dir = str(tmp_path / "dev")
    try:
        state = json.loads(
            dev(
                "up", "--dev-dir", dev_dir, "--secure", "--bookies", "3", "--brokers", "1", "--api", "--json"
            ).stdout
        )
        assert state["secure"] and state["api_key"].startswith("fpk_")
        [member] = [m for m in state["processes"] if m["kind"] == "api"]
        # The API reaches the secure cluster with the dev cluster's admin CURVE key.
        assert member["args"][member["args"].index("--key-file") + 1] == state["admin_key_file"]
        http = Http(state["api"])

        def submitted():
            status, doc, _ = http.request(
                "POST", "/v1/queues/mail/tasks", {"payload": "secure hi"}, key=state["api_key"]
            )
            return doc["task_id"] if status == 201 else None

        task_id = wait_for(submitted, 60, "a submit through the secure dev cluster's API")
        status, task, _ = http.request("GET", f"/v1/tasks/{task_id}", key=state["api_key"])
        assert status == 200 and (task["queue"], task["payload"], task["state"]) == (
            "mail",
            "secure hi",
            "waiting",
        )
        for path in ("/v1/queues/mail/tasks", f"/v1/tasks/{task_id}"):  # no key: refused, nothing made
            status, doc, _ = http.request("POST" if "queues" in path else "GET", path, {"payload": "x"})
            assert (status, doc["error"]) == (401, "unauthorized"), path
        status, doc, _ = http.request("GET", "/v1/queues", key=state["api_key"])
        assert status == 200 and doc["queues"][0]["counts"].get("waiting") == 1, doc
        http.close()
    finally:
        dev("down", "--dev-dir", dev_dir)
