"""The enable decision of feature flags and the table of `cluster features` (pure)."""

import json

import pytest

from election.feature_table import Member, decide, rows
from election.features import ADVERTISED_ENV, FLAGS, SOFTWARE_VERSION, FeatureError, advertised, parse_enabled

pytestmark = pytest.mark.timeout(30)

TABLE = {"a": "flag a", "b": "flag b"}


def member(kind, mid, features=("a", "b"), live=True, version="0.2.0"):
    return Member(kind, mid, live, version if live else None, tuple(features) if live else ())


def test_enabled_when_every_broker_and_bookie_supports_it():
    d = decide("a", TABLE, [member("broker", "1"), member("broker", "2"), member("bookie", "bk-0")])
    assert d.allowed and d.unsupported == ()


def test_refused_naming_each_member_that_does_not_support_it():
    members = [
        member("broker", "1"),
        member("broker", "2", features=("b",)),
        member("bookie", "bk-0", features=(), version=None),
    ]
    d = decide("a", TABLE, members)
    assert not d.allowed and d.unsupported == ("broker 2", "bookie bk-0")
    assert (
        "broker 2 (version 0.2.0)" in d.reason
        and "bookie bk-0 (version unknown: older than flags)" in d.reason
    )


def test_a_registered_broker_that_is_down_counts_as_not_supporting():
    d = decide("a", TABLE, [member("broker", "1"), member("broker", "3", live=False)])
    assert not d.allowed and d.unsupported == ("broker 3",)
    assert "broker 3 (down: its support is unknown)" in d.reason


def test_an_unknown_flag_is_refused_naming_the_known_ones():
    d = decide("c", TABLE, [member("broker", "1", features=("a", "b", "c"))])
    assert not d.allowed and "unknown feature flag 'c'" in d.reason and "a, b" in d.reason


def test_a_cluster_without_members_enables_nothing():
    assert not decide("a", TABLE, []).allowed


def test_rows_list_known_and_enabled_flags_with_their_supporters():
    members = [
        member("broker", "1"),
        member("broker", "2", features=("b",)),
        member("broker", "3", live=False),
    ]
    table = {row["flag"]: row for row in rows(TABLE, frozenset({"b", "z"}), members)}
    assert list(table) == ["a", "b", "z"]
    assert table["a"]["supported_by"] == ["broker 1"] and table["a"]["not_supported_by"] == [
        "broker 2",
        "broker 3",
    ]
    assert table["b"]["enabled"] and not table["a"]["enabled"]
    assert table["z"] == {
        "flag": "z",
        "enabled": True,
        "known": False,  # enabled by a newer software than this one
        "description": "",
        "supported_by": [],
        "not_supported_by": ["broker 1", "broker 2", "broker 3"],
    }


def test_a_member_advertises_every_known_flag_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv(ADVERTISED_ENV, raising=False)
    assert advertised() == {"version": SOFTWARE_VERSION, "features": sorted(FLAGS)}
    monkeypatch.setenv(ADVERTISED_ENV, "")
    assert advertised()["features"] == []
    monkeypatch.setenv(ADVERTISED_ENV, " state_digest_v4 ,x")
    assert advertised()["features"] == ["state_digest_v4", "x"]


def test_the_features_node_is_read_strictly():
    assert parse_enabled(None) == frozenset() and parse_enabled(b"") == frozenset()
    assert parse_enabled(json.dumps({"enabled": ["a"]}).encode()) == {"a"}
    for bad in (b"{nope", b'{"enabled": "a"}', b"[1]", b'{"enabled": [1]}'):
        with pytest.raises(FeatureError):
            parse_enabled(bad)
