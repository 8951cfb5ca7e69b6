"""When the checkpointer snapshots and applies retention, on a threaded fake clock.

The checkpointer thread runs for real; the snapshot catalog, the store and ZooKeeper are
stubs (writing a snapshot, publishing it and deleting ledgers have tests of their own:
test_snapshot_catalog, test_snapshot_retention, test_snapshot_join). What is checked here is
only the schedule: a checkpoint ``checkpoint_s`` after the last one once something was
applied, never for time alone; retention every RETENTION_EVERY_S, and only while leading.
"""

from __future__ import annotations

import pytest

from broker.server.store.checkpoints import RETENTION_EVERY_S, Checkpointer, CheckpointHost
from election.paths import ClusterPaths
from snapshots.policy import CheckpointPolicy
from tests.support.clock import FakeClock
from tests.support.harness import wait_for

pytestmark = pytest.mark.timeout(60)

CHECK_S = 1.0  # the thread looks at the policy once a second (or when asked)


class Catalog:
    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.created = clock, []

    def latest_valid(self):
        return None

    def create(self, store, cluster_id, broker_id, clock):
        self.created.append(self.clock.monotonic())
        return {"position": list(store.position()), "name": f"snap-{len(self.created)}"}

    def prune(self, keep: int) -> None:
        pass


class Store:
    def __init__(self) -> None:
        self.entry = 0

    def position(self):
        return (1, self.entry)


class Broker:
    """A checkpointer running on a fake clock, with what it reads of its broker."""

    def __init__(self, monkeypatch, every_s: float = 60.0) -> None:
        self.clock, self.store, self.applied, self.leading = FakeClock(threaded=True), Store(), 0, False
        self.catalog, self.retentions = Catalog(self.clock), []
        monkeypatch.setattr(Checkpointer, "_publish_latest", lambda self, header: None)
        monkeypatch.setattr(
            Checkpointer,
            "apply_retention",
            lambda checkpointer: self.retentions.append(self.clock.monotonic()),
        )
        host = CheckpointHost(
            zk=None,
            paths=ClusterPaths("c"),
            ledgers=None,
            catalog=self.catalog,
            cluster_id="cid",
            broker_id=1,
            clock=self.clock,
            policy=CheckpointPolicy(every_entries=1000, every_seconds=every_s),
            snapshots_kept=2,
            retention_seconds=0.0,
            store=lambda: self.store,
            applied_entries=lambda: self.applied,
            leading=lambda: self.leading,
            store_damaged=lambda exc: None,
            live_changed=lambda: None,
        )
        self.started = self.clock.monotonic()
        self.checkpointer = Checkpointer(host)
        self.checkpointer.start()

    def apply(self, entries: int) -> None:
        self.applied += entries
        self.store.entry += entries

    def run_for(self, seconds: float) -> None:
        """Fake time ``seconds`` on, a second at a time, each once the thread waits again."""
        for _ in range(round(seconds / CHECK_S)):
            self.clock.until_waiting(1)
            self.clock.advance(CHECK_S)
        self.clock.until_waiting(1)

    def since_start(self, times: list[float]) -> list[float]:
        return [round(t - self.started, 3) for t in times]

    def stop(self) -> None:
        self.checkpointer.stop()
        self.checkpointer.join(10)
        assert not self.checkpointer.is_alive()


@pytest.fixture
def broker(monkeypatch):
    made: list[Broker] = []

    def make(**kw) -> Broker:
        made.append(Broker(monkeypatch, **kw))
        return made[-1]

    yield make
    for b in made:
        b.stop()


def test_a_checkpoint_comes_checkpoint_s_after_the_last_once_something_was_applied(broker):
    b = broker(every_s=60.0)
    b.run_for(600.0)
    assert b.catalog.created == []  # ten minutes with nothing applied: nothing to snapshot
    b.apply(3)
    b.run_for(1.0)  # the last checkpoint (the start) is long past: due at the next look
    assert b.since_start(b.catalog.created) == [601.0]
    b.apply(3)
    b.run_for(59.0)
    assert b.since_start(b.catalog.created) == [601.0]  # 59 s after it: not yet
    b.run_for(1.0)
    assert b.since_start(b.catalog.created) == [601.0, 661.0]


def test_many_entries_make_a_checkpoint_due_at_once(broker):
    b = broker(every_s=3600.0)
    b.run_for(5.0)
    b.apply(1000)
    b.run_for(1.0)
    assert b.since_start(b.catalog.created) == [6.0]


def test_a_requested_checkpoint_does_not_wait_for_the_next_look(broker):
    b = broker(every_s=3600.0)
    b.run_for(2.0)
    b.apply(1)
    b.checkpointer.request("won leadership")
    wait_for(lambda: b.catalog.created, 10, "the requested checkpoint")  # no fake time passes
    assert b.since_start(b.catalog.created) == [2.0]


def test_retention_runs_every_retention_every_s_and_only_while_leading(broker):
    b = broker()
    b.run_for(30.0)
    assert b.retentions == []  # a follower never changes the log
    b.leading = True
    b.run_for(3 * RETENTION_EVERY_S)
    gaps = [round(y - x, 3) for x, y in zip(b.retentions, b.retentions[1:])]
    assert len(b.retentions) == 3 and gaps == [RETENTION_EVERY_S] * 2
    b.leading = False
    count = len(b.retentions)
    b.run_for(30.0)
    assert len(b.retentions) == count
