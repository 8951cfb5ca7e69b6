"""What a dev cluster's member waits for, read from its log (devtools/dev_status.py)."""

import json

import pytest

from devtools.dev_status import log_message, waiting_reason

pytestmark = pytest.mark.timeout(30)


def test_the_message_of_a_text_or_json_log_line():
    line = "2026-12-02 06:42:03,881 INFO  broker.server.store.id_turn: the cluster has no log: waiting for 3"
    assert log_message(line) == "the cluster has no log: waiting for 3"
    assert log_message(json.dumps({"ts": 1.0, "msg": "waiting for `fencepost cluster init`"})) == (
        "waiting for `fencepost cluster init`"
    )
    assert log_message("no: prefix here") == "no: prefix here"


def test_the_last_line_that_says_waiting_is_the_wait():
    log = "\n".join(
        [
            "2026-12-02 06:00:00,000 INFO  a.b: waiting for `fencepost cluster init` of cluster dev",
            "2026-12-02 06:00:01,000 INFO  a.b: cluster dev initialized (cluster id x): going on",
            "2026-12-02 06:00:02,000 INFO  c.d: the cluster has no log: waiting for 3 members (2 present)",
            "2026-12-02 06:00:03,000 WARNING kazoo: Connection dropped",
        ]
    )
    assert waiting_reason(log) == "the cluster has no log: waiting for 3 members (2 present)"
    assert waiting_reason("2026-12-02 06:00:00,000 INFO  a.b: serving") is None
