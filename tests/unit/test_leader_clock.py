"""Leader time across a failover: a successor's wall clock 60 s off neither expires leases early nor lets them linger."""

from __future__ import annotations

import pytest

from broker.server.leading.leader_clock import LeaderClock

LEASE_MS = 30_000
GAP_S = 2.0  # from the predecessor's last stamp to the successor's takeover


class Clocks:
    """Real time, and a broker's view of it: its wall clock off by `skew_s`, its own monotonic clock.

    The two readings of :class:`election.local.clock.Clock` a LeaderClock uses.
    """

    def __init__(self, skew_s: float) -> None:
        self.real = 1_000_000.0
        self.skew = skew_s

    def wall(self) -> float:
        return self.real + self.skew

    def now_ms(self) -> int:
        return int(self.wall() * 1000)

    def monotonic(self) -> float:
        return self.real - 900_000.0  # any origin: only differences count


@pytest.mark.parametrize("skew_s", [-60.0, 0.0, 60.0], ids=["60s-behind", "in-sync", "60s-ahead"])
def test_a_lease_expires_on_time_after_a_failover(skew_s):
    predecessor = Clocks(0.0)
    granted_at = int(predecessor.wall() * 1000)
    deadline = granted_at + LEASE_MS  # the lease event the predecessor stamped last

    clocks = Clocks(skew_s)
    successor = LeaderClock(clocks)
    successor.observe(granted_at - 700)  # an earlier stamp, at the follower's first look
    clocks.real = predecessor.real + 0.05  # the follower applies the lease entry 50 ms later
    successor.observe(granted_at)
    clocks.real += GAP_S
    successor.start(granted_at)
    assert successor.now_ms() > granted_at  # never backwards

    clocks.real = predecessor.real + LEASE_MS / 1000 - 0.5
    assert successor.now_ms() < deadline, "the lease expired early"
    clocks.real = predecessor.real + LEASE_MS / 1000 + 0.5
    assert successor.now_ms() >= deadline, "the lease lingered"


def test_a_broker_that_never_saw_the_stamp_uses_its_wall_clock_but_never_goes_backwards():
    clocks = Clocks(-60.0)
    fresh = LeaderClock(clocks)
    last_stamp = int(clocks.real * 1000)  # stamped by a predecessor whose clock was right
    fresh.start(last_stamp)
    first = fresh.now_ms()
    assert first == last_stamp + 1
    clocks.real += 1.0
    assert fresh.now_ms() == first + 1000


def test_a_first_look_dates_nothing():
    """A broker that just started with a store stamped long ago must not resume from that old stamp."""
    clocks = Clocks(0.0)
    clock = LeaderClock(clocks)
    old_stamp = int((clocks.real - 3600) * 1000)  # the cluster was down for an hour
    clock.observe(old_stamp)
    clock.start(old_stamp)
    assert clock.now_ms() == int(clocks.real * 1000)


def test_time_never_goes_backwards_within_a_leadership_or_across_two():
    clocks = Clocks(0.0)
    clock = LeaderClock(clocks)
    clock.start(0)
    stamps = [clock.now_ms()]
    clocks.skew = -3600.0  # the wall clock is set back an hour while we lead
    clocks.real += 0.001
    stamps.append(clock.now_ms())
    clock.stop()
    clock.start(stamps[-1])
    stamps.append(clock.now_ms())
    assert stamps == sorted(stamps) and stamps[-1] > stamps[0]


def test_the_raw_wall_clock_would_expire_the_lease_early():
    """What the broker did before: stamp with the successor's wall clock (60 s ahead)."""
    predecessor_real = 1_000_000.0
    deadline = int(predecessor_real * 1000) + LEASE_MS
    ahead = Clocks(60.0)
    ahead.real = predecessor_real + GAP_S
    assert int(ahead.wall() * 1000) >= deadline
