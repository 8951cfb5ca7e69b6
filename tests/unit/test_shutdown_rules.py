"""The pure rules of a cluster shutdown: who may stand while it is recorded, whether it is in progress,
and how `--wait-for` says what it waits for."""

from __future__ import annotations

from broker.admin.cluster_shutdown import format_report
from broker.server.standing.member_wait import wait_reason
from election.local.store_status import StoreStatus
from election.shutdown_node import in_progress, shutdown_hold

DOC = {"shutdown_id": "s1", "requested_at": 1.0, "members": [1, 2, 3]}


def test_nobody_is_held_without_a_shutdown():
    assert shutdown_hold(None, None) == ""
    assert shutdown_hold(None, StoreStatus("c", 1.0)) == ""


def test_only_a_store_that_very_shutdown_left_clean_may_stand():
    assert shutdown_hold(DOC, StoreStatus("c", 1.0, "clean", "s1", (3, 9))) == ""
    for status in (None, StoreStatus("c", 1.0), StoreStatus("c", 1.0, "clean", "s0", (2, 4))):
        assert "s1" in shutdown_hold(DOC, status)


def test_a_shutdown_is_in_progress_while_a_member_runs_without_having_recorded_its_stop():
    assert in_progress(None, {}, {1, 2}) == []
    assert in_progress(DOC, {1: {}}, {1, 2, 3}) == [2, 3]
    assert in_progress(DOC, {1: {}, 2: {}}, {1, 2, 4}) == []  # 3 is gone, 4 is not a member


def test_the_wait_is_said_the_same_way_everywhere():
    assert wait_reason(3, 2) == "waiting for 3 members (2 present)"


def test_the_report_names_each_member_and_what_it_did():
    report = {
        "cluster": "dev",
        "shutdown_id": "s1",
        "position": [3, 9],
        "ok": False,
        "members": [
            {"id": 1, "name": "b1", "state": "clean", "position": [3, 9], "clean": True},
            {"id": 2, "name": None, "state": "timed_out", "position": None, "clean": False},
        ],
    }
    text = format_report(report)
    assert "shutdown s1 at position [3, 9]" in text
    assert "broker 1" in text and "stopped clean  position=[3, 9]" in text
    assert "broker 2" in text and "still running (timed out)" in text
    assert "1 of 2 brokers stopped clean" in text


def test_a_member_that_records_its_stop_and_exits_between_two_reads_is_not_reported_gone(monkeypatch):
    """The wait reads the live nodes, then the stops: a member gone from the first has its stop in the second.

    Here the member records its stop and exits right after the wait's first ZooKeeper read, whichever
    that is (the integration tests of the shutdown saw it reported "gone" under load when the stops
    were read first).
    """
    from broker.admin import cluster_shutdown
    from tests.support.clock import FakeClock

    reads = []
    stop = {"shutdown_id": "s1", "state": "clean", "position": [3, 9]}

    def read_stops(zk, paths, shutdown_id):
        reads.append("stops")
        return {7: stop} if len(reads) > 1 else {}

    def live_brokers(zk, paths):
        reads.append("live")
        return {} if len(reads) > 1 else {7: {"address": "tcp://b7"}}

    monkeypatch.setattr(cluster_shutdown, "read_stops", read_stops)
    monkeypatch.setattr(cluster_shutdown, "live_brokers", live_brokers)
    clock = FakeClock()
    stops = cluster_shutdown._wait_for_members(None, None, "s1", [7], clock.monotonic() + 60, clock)
    assert stops == {7: stop}
