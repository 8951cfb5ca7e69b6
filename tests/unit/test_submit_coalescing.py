"""Coalesced submits: the protocol's per-item ``submit_many`` results, and the client's submit pipeline.

The pipeline tests run against a scripted ZeroMQ ROUTER on 127.0.0.1 (no real
broker) with short timeouts, like tests/unit/test_client_retry.py.
"""
from __future__ import annotations

import pytest

from broker.protocol import RequestError, check_request, reply_fields, request_events

pytestmark = pytest.mark.timeout(30)


# ------------------------------------------------------------------ protocol: submit_many with each


def test_submit_many_each_reports_every_item_in_order():
    req = check_request({"op": "submit_many", "each": True, "tasks": [
        {"queue": "q", "payload": b"a"}, {"queue": "q", "payload": b"b", "key": "k"}]}, 1024)
    assert req["each"] is True and len(request_events(req, 1, iter(["t1", "t2"]).__next__)) == 2
    results = [{"ok": True, "task_id": "t1", "created": True},
               {"ok": False, "error": "duplicate_task_id", "message": "task id 't2' already exists"}]
    assert reply_fields(req, results) == {"results": [
        {"ok": True, "task_id": "t1"},
        {"ok": False, "error": "duplicate_task_id", "message": "task id 't2' already exists"}]}


def test_submit_many_without_each_keeps_its_old_reply():
    req = check_request({"op": "submit_many", "tasks": [{"queue": "q", "payload": b"a"}]}, 1024)
    assert req["each"] is False
    assert reply_fields(req, [{"ok": True, "task_id": "t1"}]) == {"task_ids": ["t1"]}
    with pytest.raises(RequestError) as err:
        reply_fields(req, [{"ok": False, "error": "duplicate_task_id", "message": "m"}])
    assert err.value.code == "duplicate_task_id"


def test_each_must_be_a_boolean():
    with pytest.raises(RequestError) as err:
        check_request({"op": "submit_many", "each": "yes", "tasks": [{"queue": "q", "payload": b"a"}]}, 1024)
    assert err.value.code == "bad_request"
    req = check_request({"op": "submit_many", "each": None, "tasks": [{"queue": "q", "payload": b"a"}]}, 1024)
    assert req["each"] is False
