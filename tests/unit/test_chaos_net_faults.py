"""What each network fault of a chaos run cuts, on a cluster of 3 test hosts and 4 bookies (no network made)."""

import threading

import pytest

from devtools import schedule as S
from devtools.fault_targets import name_of
from devtools.net_faults import NetFaults

# bookie i and broker i on h<i mod 3 + 1>: h1 holds bookie-0, bookie-3 and broker-0.
PROCESSES = [
    {"kind": "zookeeper", "host": "zk"},
    *({"kind": "bookie", "index": i, "host": f"h{i % 3 + 1}"} for i in range(4)),
    *({"kind": "broker", "index": i, "host": f"h{i % 3 + 1}"} for i in range(3)),
]


class FakeNet:
    def hosts(self):
        return {"zk": {}, "h1": {}, "h2": {}, "h3": {}}


class FakeDev:
    net = FakeNet()

    def read_state(self):
        return {"hosts": 3, "processes": PROCESSES}


class FakeTargets:
    def members(self, kind):
        return [m for m in PROCESSES if m["kind"] == kind]


def faults(busy=()):
    return NetFaults(FakeDev(), FakeTargets(), threading.Lock(), lambda name: name in busy, ack_quorum=2)


def fault(kind, pick=0, variant=""):
    return S.Fault(
        seq=0, at_s=5.0, kind=kind, slot=S.SLOT_NETWORK, pick=pick, down_s=2.0, recover_s=1.0, variant=variant
    )


def broker(index):
    return next(m for m in PROCESSES if m["kind"] == "broker" and m["index"] == index)


def test_the_leader_cut_from_zookeeper_only():
    cut = faults().plan_cut(fault(S.CUT_LEADER_ZK), broker(1))
    assert cut.parts == ((("h2",), ("zk",), False),) and cut.centres == ("h2",)
    assert cut.target == "broker-1 on h2"


def test_the_leader_cut_from_the_hosts_of_the_other_bookies():
    cut = faults().plan_cut(fault(S.CUT_LEADER_BOOKIES), broker(0))
    assert cut.parts == ((("h1",), ("h2", "h3"), False),)


def test_the_leader_cut_from_followers_and_clients_keeps_zookeeper():
    cut = faults().plan_cut(fault(S.CUT_LEADER_PEERS), broker(2))
    assert cut.parts == ((("h3",), ("local", "h1", "h2"), False),)


@pytest.mark.parametrize(
    "variant, parts",
    [
        (S.DEAF, ((("h1",), ("local", "h2", "h3", "zk"), True),)),
        (S.MUTE, ((("local", "h2", "h3", "zk"), ("h1",), True),)),
    ],
)
def test_one_way_cuts_of_the_leader(variant, parts):
    cut = faults().plan_cut(fault(S.ONE_WAY_LEADER, variant=variant), broker(0))
    assert cut.parts == parts and cut.centres == ("h1",)


def test_an_isolated_bookie_is_not_on_the_leaders_host():
    for pick in range(6):
        cut = faults().plan_cut(fault(S.ISOLATE_BOOKIE, pick=pick), broker(0))
        (host,) = cut.centres
        assert host in ("h2", "h3") and cut.parts == (((host,), None, False),)
        assert f"bookie-{int(host[1]) - 1}" in cut.target


def test_two_bookies_isolated_when_an_ack_quorum_is_left():
    # The leader on h1 keeps bookie-0 and bookie-3: two, the ack quorum.
    cut = faults().plan_cut(fault(S.ISOLATE_TWO_BOOKIES), broker(0))
    assert sorted(cut.centres) == ["h2", "h3"]
    assert sorted(cut.parts) == [(("h2",), None, False), (("h3",), None, False)]


def test_one_bookie_isolated_when_two_would_leave_less_than_an_ack_quorum():
    # The leader on h2: cutting h1 and h3 would leave bookie-1 alone.
    cut = faults().plan_cut(fault(S.ISOLATE_TWO_BOOKIES), broker(1))
    assert len(cut.centres) == 1 and "fewer than the ack quorum" in cut.note
    # A bookie killed by another fault does not count as reachable.
    cut = faults(busy={"bookie-3"}).plan_cut(fault(S.ISOLATE_TWO_BOOKIES), broker(0))
    assert len(cut.centres) == 1


def test_without_a_known_leader_a_bookie_host_is_still_isolated():
    cut = faults().plan_cut(fault(S.ISOLATE_BOOKIE, pick=0), None)
    assert cut.centres == ("h1",)


def test_names_of_members():
    assert [name_of(m) for m in PROCESSES[:2]] == ["zookeeper", "bookie-0"]
