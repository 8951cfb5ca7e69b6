"""`fencepost dev up --api --json`: a dev cluster with its HTTP API, its address and admin key in cluster.json;
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
