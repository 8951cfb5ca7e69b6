"""A follower's leader watch against a real ZooKeeper and leaders made of real sockets.

The leader is a serving kernel on loopback (the one brokers use), or a socket that never
answers, published in a ``leader`` node and an election node of its own ZooKeeper session; the
watch (:class:`broker.server.standing.leader_watch.LeaderWatch`) runs its real loop. Checked: a
leader that answers is never suspected; one older than ``follower_ping`` (its kernel answers
``unknown_op``) is never suspected, whatever happens to it (it is left to its session expiry);
a leader whose socket closes (a dead process) is unseated within the grace; a silent one only
once its live node stopped changing too, never while its live node is refreshed (a cut between
it and this follower).
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import zmq

from broker.server.config import BrokerConfig
from broker.server.standing.leader_watch import LeaderWatch
from broker.server.standing.suspicion import LOST_GRACE_S
from election import wire
from election.local.clock import SYSTEM_CLOCK
from election.wire.kernel import ServingKernel
from election.zk import close, connect
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

LEADER_ID = 9
TIMEOUT_S = BrokerConfig.leader_timeout_s
# How long a test watches a leader that must not be suspected: several leader timeouts.
QUIET_S = 3 * TIMEOUT_S


class Leader:
    """A leader for the watch: its socket on loopback and its ZooKeeper session's nodes."""

    def __init__(self, cluster, port: int, answers: bool = True, knows_ping: bool = True) -> None:
        self.address = f"tcp://127.0.0.1:{port}"
        self.zk = connect(cluster.hosts, session_timeout=10.0)
        self.paths = cluster.paths
        self.stop = threading.Event()
        ops = {"ping": lambda msg, ctx: wire.ok_reply(ctx.rid)}
        if knows_ping:
            ops["follower_ping"] = lambda msg, ctx: wire.ok_reply(ctx.rid, broker_id=LEADER_ID, epoch=1)
        self.kernel = ServingKernel("broker", ops, 1 << 20)
        self.kernel.bind(zmq.Context.instance(), self.address)
        self.thread = threading.Thread(target=self._serve, args=(answers,), daemon=True)
        self.thread.start()
        info = {"broker_id": LEADER_ID, "address": self.address, "epoch": 1}
        self.zk.ensure_path(self.paths.election)
        self.election_node = self.zk.create(f"{self.paths.election}/n_", b"9", ephemeral=True, sequence=True)
        self.zk.create(self.paths.live_broker(LEADER_ID), b"{}", ephemeral=True, makepath=True)
        self.zk.create(self.paths.leader, json.dumps(info).encode(), ephemeral=True)

    def _serve(self, answers: bool) -> None:
        while not self.stop.is_set():
            if answers and self.kernel.poll(20):
                self.kernel.serve_turn(100)
            elif not answers:
                self.stop.wait(0.02)  # reads nothing: requests stay queued, unanswered
        self.kernel.close()  # the process is gone: its connections close

    def die(self) -> None:
        self.stop.set()
        self.thread.join(5)

    def refresh_live_node(self, until: threading.Event) -> threading.Thread:
        """Rewrite the live node every 0.4 s, as a broker reaching ZooKeeper does."""

        def run() -> None:
            while not until.wait(0.4):
                self.zk.set(self.paths.live_broker(LEADER_ID), b"{}")

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def pinged(self, count: int = 1) -> bool:
        """Whether this leader received ``count`` requests (the watch's pings) so far."""
        return self.kernel.counters["requests"] >= count

    def seated(self) -> bool:
        return (
            self.zk.exists(self.paths.leader) is not None and self.zk.exists(self.election_node) is not None
        )

    def close(self) -> None:
        self.die()
        close(self.zk)


class Watch:
    """The follower's watch (broker 2), acting whenever it suspects; its suspicions are recorded."""

    def __init__(self, cluster) -> None:
        self.stop = threading.Event()
        self.acted: list[float] = []

        def may_act(suspect: int) -> bool:
            assert suspect == LEADER_ID
            self.acted.append(time.monotonic())
            return True

        self.watch = LeaderWatch(
            cluster.zk,
            cluster.paths,
            2,
            BrokerConfig(),
            position=lambda: (0, 5),
            may_act=may_act,
            cleared=lambda: None,
            stop=self.stop,
            clock=SYSTEM_CLOCK,
        )
        self.watch.start()

    def close(self) -> None:
        self.stop.set()


@pytest.fixture
def parts(cluster, free_port):
    made: list = []

    def make(**kwargs):
        leader = Leader(cluster, free_port(), **kwargs)
        watch = Watch(cluster)
        made.extend([watch, leader])
        return leader, watch

    yield make
    for part in made:
        part.close()


def test_an_answering_leader_is_never_suspected(parts):
    leader, watch = parts()
    wait_for(leader.pinged, 10, "the watch's first ping")
    time.sleep(QUIET_S)  # a window in which nothing may happen
    assert watch.acted == [] and leader.seated() and leader.pinged(int(QUIET_S / 0.1) // 2)


def test_a_leader_older_than_the_ping_is_left_to_its_session_even_once_dead(parts):
    leader, watch = parts(knows_ping=False)
    wait_for(leader.pinged, 10, "the watch's first ping (answered unknown_op)")
    leader.die()
    time.sleep(QUIET_S)  # a window in which nothing may happen
    assert watch.acted == [] and leader.seated()


def test_a_dead_leader_is_unseated_within_the_grace(parts):
    leader, watch = parts()
    wait_for(lambda: leader.pinged(3), 10, "the watch's pings to be answered")
    died = time.monotonic()
    leader.die()
    wait_for(lambda: watch.acted, 10, "the watch to suspect the dead leader")
    took = watch.acted[0] - died
    print(f"dead leader suspected {took:.2f} s after its socket closed (grace {LOST_GRACE_S} s)")
    assert took < TIMEOUT_S, f"suspected after {took:.2f} s: by its silence, not its closed connection"
    wait_for(lambda: not leader.seated(), 10, "its leader and election nodes to be deleted")


def test_a_silent_leader_is_unseated_once_its_live_node_stops_too(parts):
    leader, watch = parts(answers=False)
    started = time.monotonic()
    wait_for(lambda: watch.acted, 10, "the watch to suspect the silent leader")
    took = watch.acted[0] - started
    print(f"silent leader suspected after {took:.2f} s (leader_timeout_s {TIMEOUT_S} s)")
    assert took >= TIMEOUT_S - 0.05
    wait_for(lambda: not leader.seated(), 10, "its leader and election nodes to be deleted")


def test_a_silent_leader_that_refreshes_its_live_node_is_not_suspected(parts):
    leader, watch = parts(answers=False)
    refreshing = threading.Event()
    refresher = leader.refresh_live_node(refreshing)
    try:
        time.sleep(QUIET_S)  # a window in which nothing may happen
        assert watch.acted == [] and leader.seated()
    finally:
        refreshing.set()
        refresher.join(5)
    wait_for(lambda: watch.acted, 10, "the watch to suspect it once its live node stopped")
