"""A would-be leader short of bookies: the candidacy's hold, the live-node fields, and what `status` says."""

from __future__ import annotations

import json

from kazoo.exceptions import ConnectionLoss, NoNodeError

from broker.admin.status import waiting_for_bookies
from broker.server.standing.bookie_wait import BookieWait
from election.cluster_view import format_status
from election.paths import ClusterPaths
from tests.support.clock import FakeClock
from tests.support.zk_answers import answer

PATHS = ClusterPaths("dev")


class FakeZk:
    """Just the reads BookieWait makes: ``bookies/`` children (with a one-shot watch) and their data."""

    def __init__(self) -> None:
        self.bookies: dict[str, dict] | None = {}
        self.watches: list = []
        self.reads = 0
        self.down = False

    def get_children(self, path, watch=None):
        if self.down:
            raise ConnectionLoss()
        if path == PATHS.decommissioning:
            raise NoNodeError()  # no bookie is being decommissioned
        self.reads += 1
        if self.bookies is None:
            raise NoNodeError()
        if watch is not None:
            self.watches.append(watch)
        return list(self.bookies)

    def get_children_async(self, path):
        return answer(lambda: self.get_children(path))

    def get(self, path):
        name = path.rsplit("/", 1)[1]
        if self.bookies is None or name not in self.bookies:
            raise NoNodeError()
        return json.dumps(self.bookies[name]).encode(), None

    def get_async(self, path):
        """``get`` as kazoo's pipelined form: an object whose ``get()`` gives the answer or raises."""
        try:
            found, error = self.get(path), None
        except NoNodeError as exc:
            found, error = None, exc

        class Answer:
            def get(self):
                if error is not None:
                    raise error
                return found

        return Answer()

    def register(self, name: str, port: int, **extra) -> None:
        self.bookies[name] = {"address": f"tcp://127.0.0.1:{port}", "free_bytes": 1 << 34, **extra}
        self.fire()

    def fire(self) -> None:
        watches, self.watches = self.watches, []
        for w in watches:
            w(None)


def make(zk: FakeZk, need: int = 3):
    clock, changes = FakeClock(), []
    wait = BookieWait(
        zk, PATHS, need, changed=lambda: changes.append(wait.live_fields()), poll_s=1.0, clock=clock
    )
    return wait, clock, changes


def test_holds_while_short_and_stands_once_a_bookie_registers():
    zk = FakeZk()
    zk.register("b1", 1)
    zk.register("b2", 2)
    wait, _, changes = make(zk)
    assert wait.hold() == "waiting for 3 bookies, 2 live"
    assert wait.live_fields() == {"waiting_for_bookies": 3, "live_bookies": 2}
    assert wait.reason() == "no broker can lead yet: waiting for 3 bookies, 2 live"
    zk.register(
        "b3", 3
    )  # the watch marks the count stale: seen at the next hold, without waiting for the poll
    assert wait.hold() == ""
    assert wait.live_fields() == {} and wait.reason() == ""
    assert changes == [
        {"waiting_for_bookies": 3, "live_bookies": 2},
        {},
    ]  # the live node is rewritten at each change


def test_reads_only_on_a_watch_or_when_the_poll_is_due():
    zk = FakeZk()
    for i in range(3):
        zk.register(f"b{i}", i)
    wait, clock, _ = make(zk)
    assert wait.hold() == ""
    reads = zk.reads
    for _ in range(10):
        wait.hold()
    assert zk.reads == reads
    # A registration turning read-only changes its data, not the children: the poll finds it.
    zk.bookies["b0"]["readonly"] = True
    assert wait.hold() == ""
    clock.advance(1.0)
    assert wait.hold() == "waiting for 3 bookies, 2 live"


def test_the_takeovers_fresh_count_is_taken_at_once():
    zk = FakeZk()
    for i in range(3):
        zk.register(f"b{i}", i)
    wait, _, _ = make(zk)
    assert wait.hold() == ""
    wait.saw(2)  # the takeover's check before its claim found one gone
    assert wait.hold() == "waiting for 3 bookies, 2 live"


def test_no_bookies_node_yet_and_zookeeper_trouble():
    zk = FakeZk()
    zk.bookies = None
    wait, clock, _ = make(zk)
    assert wait.hold() == "waiting for 3 bookies, 0 live"
    zk.bookies = {}
    for i in range(3):
        zk.register(f"b{i}", i)
    zk.down = True
    clock.advance(5)
    assert wait.hold() == "waiting for 3 bookies, 0 live"  # what we knew, until ZooKeeper answers
    zk.down = False
    clock.advance(5)
    assert wait.hold() == ""


def test_two_ids_on_one_address_count_once():
    zk = FakeZk()
    zk.register("b1", 1)
    zk.register("b2", 2)
    zk.register("b2-old", 2)
    wait, _, _ = make(zk)
    assert wait.hold() == "waiting for 3 bookies, 2 live"


def view(leader=None, brokers=()):
    return {
        "cluster": "dev",
        "cluster_id": "c1",
        "initialized": True,
        "leader": leader,
        "epoch": 4,
        "brokers": list(brokers),
        "insync": [],
        "bookies": [{"id": "b1", "address": "tcp://h:1", "free_bytes": 5, "readonly": True}],
        "ledgers": [],
        "queues": {},
    }


def test_status_says_no_leader_waiting_for_bookies():
    brokers = [
        {"id": 1, "role": "follower", "waiting_for_bookies": 3, "live_bookies": 2},
        {"id": 2, "role": "follower", "waiting_for_bookies": 3, "live_bookies": 1},
        {"id": 3, "role": "follower"},
    ]
    v = view(brokers=brokers)
    v["waiting_bookies"] = waiting_for_bookies(v)
    assert v["waiting_bookies"] == {"waiting_for": 3, "live": 2}
    text = format_status(v)
    assert "no leader: waiting for 3 bookies, 2 live" in text
    assert "read-only" in text
    assert waiting_for_bookies(view(leader=1, brokers=brokers)) is None
    assert waiting_for_bookies(view(brokers=[{"id": 3, "role": "follower"}])) is None


def test_an_open_ledger_that_cannot_be_recovered_holds_for_a_while_and_status_says_why():
    zk = FakeZk()
    for i in (1, 2, 3):
        zk.register(f"b{i}", i)
    wait, clock, changes = make(zk)
    assert wait.hold() == ""
    why = "waiting for the bookies of ledger 7: 1 of its last ensemble live, recovery needs 2"
    wait.saw(3, why)  # the takeover's check found the open ledger short
    assert wait.hold() == why and wait.reason() == f"no broker can lead yet: {why}"
    assert wait.live_fields() == {"waiting_for_bookies": 3, "live_bookies": 3, "waiting_reason": why}
    assert changes[-1]["waiting_reason"] == why
    clock.advance(2.5)  # then the takeover may check again
    assert wait.hold() == "" and wait.live_fields() == {}

    v = view(
        brokers=[
            {"id": 1, "role": "follower", "waiting_for_bookies": 3, "live_bookies": 3, "waiting_reason": why}
        ]
    )
    v["waiting_bookies"] = waiting_for_bookies(v)
    assert v["waiting_bookies"]["reason"] == why
    assert f"no leader: {why}" in format_status(v)
