"""Feature flags and wire versions with a real ZooKeeper, bookies and a broker.

- every member advertises its version and flags; `cluster features --json` lists who supports each;
- `cluster enable-feature` is refused while a bookie advertises no flags (one started as an older
  version would be, through the documented test override) and while a registered broker is down,
  naming each; accepted once every member supports the flag; the leader's DataWatch sees it;
- a request of a protocol version outside the range gets `wrong_version` naming both, and the
  broker and the bookie keep serving.
"""

from __future__ import annotations

import json

import pytest

from election import wire
from election.features import ADVERTISED_ENV, SOFTWARE_VERSION, EnabledFeatures
from election.wire.exchange import exchange
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FLAG = "state_digest_v4"


def _run(procs, cluster, *args):
    return procs.run(["cluster", *args, "--zk", cluster.hosts, "--cluster", cluster.name])


def _features(procs, cluster) -> dict:
    result = _run(procs, cluster, "features", "--json")
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def _bookie_id(cluster, address: str) -> str:
    for child in cluster.zk.get_children(cluster.paths.bookies):
        if json.loads(cluster.zk.get(cluster.paths.bookie(child))[0]).get("address") == address:
            return child
    raise AssertionError(f"no registration at {address}")


def _refusal(result) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    return result.stderr.decode().strip().splitlines()[-1]


def test_enable_feature_waits_for_every_member_and_the_wire_refuses_other_versions(cluster, procs):
    init = _run(procs, cluster, "init", "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1")
    assert init.returncode == 0, init.stderr.decode()
    new_bookie = procs.start_bookie(cluster, fsync=False)
    old_bookie = procs.start_bookie(cluster, fsync=False, env={ADVERTISED_ENV: ""})
    broker = procs.start_broker(cluster)
    new_id, old_id = _bookie_id(cluster, new_bookie.address), _bookie_id(cluster, old_bookie.address)
    wait_for(lambda: cluster.zk.exists(cluster.paths.live_broker(1)), 30, "the broker's live node")
    live = json.loads(cluster.zk.get(cluster.paths.live_broker(1))[0])
    assert live["version"] == SOFTWARE_VERSION and FLAG in live["features"]

    report = _features(procs, cluster)
    row = next(r for r in report["flags"] if r["flag"] == FLAG)
    assert not row["enabled"] and row["description"]
    assert sorted(row["supported_by"]) == sorted(["broker 1", f"bookie {new_id}"])
    assert row["not_supported_by"] == [f"bookie {old_id}"]
    members = {m["member"]: m for m in report["members"]}
    assert (
        members[f"bookie {old_id}"]["features"] == [] and members["broker 1"]["version"] == SOFTWARE_VERSION
    )

    line = _refusal(_run(procs, cluster, "enable-feature", FLAG))
    assert f"bookie {old_id}" in line and "broker 1" not in line and new_id not in line
    assert not cluster.zk.exists(cluster.paths.features)
    assert "unknown feature flag 'no_such_flag'" in _refusal(
        _run(procs, cluster, "enable-feature", "no_such_flag")
    )

    # The old bookie leaves; a broker that is registered but down still holds the flag back.
    old_bookie.terminate()
    wait_for(
        lambda: not cluster.zk.exists(cluster.paths.bookie(old_id)), 30, "the old bookie's registration gone"
    )
    cluster.zk.create(cluster.paths.broker_id(9), json.dumps({"name": "gone"}).encode())
    assert "broker 9 (down: its support is unknown)" in _refusal(_run(procs, cluster, "enable-feature", FLAG))
    cluster.zk.delete(cluster.paths.broker_id(9))

    watch = EnabledFeatures(cluster.zk, cluster.paths)
    assert not watch.enabled(FLAG)
    done = _run(procs, cluster, "enable-feature", FLAG, "--json")
    assert done.returncode == 0 and json.loads(done.stdout) == {
        "flag": FLAG,
        "enabled": True,
        "changed": True,
    }
    assert json.loads(cluster.zk.get(cluster.paths.features)[0]) == {"enabled": [FLAG]}
    wait_for(lambda: watch.enabled(FLAG), 10, "the DataWatch to see the flag")
    again = _run(procs, cluster, "enable-feature", FLAG)
    assert again.returncode == 0 and b"already enabled" in again.stdout
    assert next(r for r in _features(procs, cluster)["flags"] if r["flag"] == FLAG)["enabled"]

    for member in (broker, new_bookie):
        refused = exchange(member.address, "ping", timeout=5.0, v=wire.PROTOCOL_VERSION + 1)
        assert refused["ok"] is False and refused["error"] == "wrong_version"
        assert f"version {wire.PROTOCOL_VERSION + 1}" in refused["message"]
        assert wire.SERVED_VERSIONS.text() in refused["message"]
        served = max(wire.BASE_PROTOCOL_VERSION, wire.PROTOCOL_VERSION - 1)
        assert exchange(member.address, "ping", timeout=5.0, v=served)["ok"]


def test_a_broker_lacking_an_enabled_flag_is_refused_at_start_naming_it(cluster, procs):
    init = _run(procs, cluster, "init", "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1")
    assert init.returncode == 0, init.stderr.decode()
    procs.start_bookie(cluster, fsync=False)
    assert _run(procs, cluster, "enable-feature", FLAG).returncode == 0
    old = procs.start_broker(cluster, ready=False, env={ADVERTISED_ENV: ""})
    assert old.wait(60) == 1
    assert f"has enabled feature flag(s) {FLAG}, which this broker's version" in old.output()
    assert not cluster.zk.exists(cluster.paths.broker_ids) or not cluster.zk.get_children(
        cluster.paths.broker_ids
    )
