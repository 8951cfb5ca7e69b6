"""Names, addresses and firewall rules of a test network (pure: devtools/hosts/plan.py)."""

from __future__ import annotations

import itertools

import pytest

from devtools.hosts.plan import LOCAL, HostsError, NetPlan, check_host_name, cut_pairs, cut_rules, heal_pairs

HOSTS = ["zk", "h1", "h2", "h3"]


def test_a_network_has_its_own_subnet_bridge_and_short_interface_names():
    plan = NetPlan(249)
    host = plan.host("client", 200)
    assert plan.subnet == "10.213.249.0/24" and plan.gateway == "10.213.249.1"
    assert host.address == "10.213.249.210" and host.netns == "fp249-client"
    # Linux refuses interface names of 16 characters or more.
    assert len(plan.bridge) <= 15 and len(host.veth) <= 15


def test_addresses_of_hosts_differ_and_stay_in_the_subnet():
    plan = NetPlan(7)
    addresses = [plan.host(f"h{k}", k).address for k in range(1, 201)]
    assert len(set(addresses)) == 200
    assert all(a.startswith("10.213.7.") and 10 < int(a.rsplit(".", 1)[1]) < 255 for a in addresses)


@pytest.mark.parametrize("name", ["", "local", "H1", "1h", "toolongname", "h-1"])
def test_bad_host_names_are_refused(name):
    with pytest.raises(HostsError):
        check_host_name(name)


def test_a_two_way_cut_drops_both_directions_and_one_way_only_what_the_far_side_sends():
    assert cut_pairs(["h1"], ["zk", "h2"], one_way=False) == {
        ("h1", "zk"),
        ("zk", "h1"),
        ("h1", "h2"),
        ("h2", "h1"),
    }
    # `partition h1 --from h2 --one-way`: h1 no longer hears h2, h2 still hears h1.
    assert cut_pairs(["h1"], ["h2"], one_way=True) == {("h2", "h1")}


def test_a_cut_needs_two_disjoint_sides():
    with pytest.raises(HostsError):
        cut_pairs(["h1"], ["h1", "h2"], one_way=False)
    with pytest.raises(HostsError):
        cut_pairs([], ["h2"], one_way=False)


def test_healing_a_host_keeps_the_cuts_of_others():
    pairs = cut_pairs(["h1"], ["h2"], False) | cut_pairs(["h3"], ["zk"], True)
    assert heal_pairs(pairs, "h1") == {("zk", "h3")}
    assert heal_pairs(pairs, None) == set()


def test_every_cut_pair_is_dropped_on_both_ends_and_nothing_else_is():
    plan = NetPlan(3)
    addresses = {name: plan.host(name, k).address for k, name in enumerate(HOSTS, start=1)}
    addresses[LOCAL] = plan.gateway
    everyone = [*HOSTS, LOCAL]
    for sender, receiver in itertools.permutations(everyone, 2):
        rules = cut_rules({(sender, receiver)}, addresses)
        assert LOCAL not in rules
        dropped = {(name, tuple(rule)) for name, held in rules.items() for rule in held}
        expected = set()
        if sender != LOCAL:
            expected.add((sender, ("-d", addresses[receiver], "-j", "DROP")))
        if receiver != LOCAL:
            expected.add((receiver, ("-s", addresses[sender], "-j", "DROP")))
        assert dropped == expected
