"""Cluster-wide task settings: the spec, the event, its apply, the leader's logging, what a broker acts on."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from broker.server.leading.housekeeping import Housekeeping
from broker.server.task_settings_view import EffectiveConfig
from broker.state.events import BadEvent, event
from election.cluster_config import ClusterOptions, new_config
from election.task_settings import (
    FLAG,
    SETTINGS,
    SettingError,
    checked,
    configured,
    defaults,
    effective,
    parse_value,
    unrecorded,
)
from tests.support.replica import Replica


@pytest.fixture
def r(tmp_path):
    rep = Replica(tmp_path / "s")
    yield rep
    rep.store.close()


def own(**over):
    """A broker's own options: the defaults, with ``over`` in place."""
    return SimpleNamespace(**{**defaults(), "worker_seen_s": 0.0, **over})


@pytest.mark.parametrize(
    "name, text, value",
    [
        ("retry_backoff_ms", "250", 250),
        ("worker_lost_s", "2", 2.0),
        ("result_ttl_s", "0", 0.0),
        ("allow_lagging_leader", "off", False),
        ("allow_lagging_leader", "TRUE", True),
    ],
)
def test_values_parse_with_their_type(name, text, value):
    parsed = parse_value(name, text)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("retry_backoff", "1", "no task setting 'retry_backoff' (known: default_lease_ms"),
        ("default_lease_ms", "0", "default_lease_ms must be at least 1"),
        ("default_lease_ms", "1.5", "must be an integer"),
        ("worker_lost_s", "0.1", "worker_lost_s must be at least 0.5"),
        ("max_time_not_caught_up_s", "0", "must be above 0"),
        ("retry_backoff_ms", str(1 << 41), "at most"),
        ("allow_lagging_leader", "maybe", "true or false"),
        ("worker_lost_s", "nan", "worker_lost_s must be"),
    ],
)
def test_bad_names_and_values_are_refused_naming_them(name, text, words):
    with pytest.raises(SettingError) as info:
        parse_value(name, text)
    assert words in str(info.value)


def test_effective_prefers_the_log_then_the_config_then_the_broker():
    mine = own(retry_backoff_ms=5)
    assert effective("retry_backoff_ms", {}, {}, mine) == 5
    assert effective("retry_backoff_ms", {}, {"retry_backoff_ms": 7}, mine) == 7
    assert effective("retry_backoff_ms", {"retry_backoff_ms": 9}, {"retry_backoff_ms": 7}, mine) == 9
    assert unrecorded({"retry_backoff_ms": 7, "worker_lost_s": 2.0}, {"retry_backoff_ms": 7}) == [
        ("worker_lost_s", 2.0)
    ]


def test_a_standing_rule_is_the_config_nodes_first_so_a_leaderless_shard_sees_it_change():
    mine = own(allow_lagging_leader=True)
    assert effective("allow_lagging_leader", {"allow_lagging_leader": True}, {}, mine) is True
    logged_on = {"allow_lagging_leader": True}
    assert effective("allow_lagging_leader", logged_on, {"allow_lagging_leader": False}, mine) is False


def test_a_new_config_holds_every_setting_and_a_bad_value_in_a_node_is_left_out(caplog):
    config = new_config(ClusterOptions(), clock=lambda: 1.0, task_settings={"result_ttl_s": 60})
    assert configured(config) == {**defaults(), "result_ttl_s": 60.0}
    with pytest.raises(SettingError):
        new_config(ClusterOptions(), clock=lambda: 1.0, task_settings={"default_lease_ms": -1})
    assert configured({"task_settings": {"default_lease_ms": -1, "worker_lost_s": 3}}) == {
        "worker_lost_s": 3.0
    }
    assert "cannot use" in caplog.text
    assert configured({"cluster_id": "old"}) == {}  # a cluster made before task settings


def test_setting_changed_is_checked_with_its_name():
    assert event("SettingChanged", name="worker_lost_s", value=3, now_ms=1)["value"] == 3.0
    for bad in (
        {"name": "nope", "value": 1},
        {"name": "worker_lost_s", "value": 0.1},
        {"name": "allow_lagging_leader", "value": 1},
        {"name": "default_lease_ms", "value": "5"},
    ):
        with pytest.raises(BadEvent):
            event("SettingChanged", now_ms=1, **bad)


def test_apply_records_each_change_in_the_digest(r):
    before = r.store.digest()
    assert r.do("SettingChanged", name="retry_backoff_ms", value=250, now_ms=1) == {
        "ok": True,
        "name": "retry_backoff_ms",
        "value": 250,
        "previous": None,
    }
    res = r.do("SettingChanged", name="retry_backoff_ms", value=500, now_ms=2)
    assert res["previous"] == 250
    r.do("SettingChanged", name="allow_lagging_leader", value=False, now_ms=3)
    assert r.store.task_settings() == {"allow_lagging_leader": False, "retry_backoff_ms": 500}
    assert r.store.digest() != before and r.store.recompute_digest() == r.store.digest()


def test_the_leader_logs_what_the_config_holds_only_with_the_flag_and_then_acts_on_it(r):
    node = {"retry_backoff_ms": 250, "worker_lost_s": 60.0}
    flags: set[str] = set()
    mine = own(retry_backoff_ms=1000, worker_lost_s=5.0, max_batch_events=7)
    config = EffectiveConfig(mine, lambda: r.store, lambda: node)
    hk = Housekeeping(lambda: r.store, config, flags.__contains__)
    hk.start(0)
    assert hk.due(0, 0.0) == [] and config.retry_backoff_ms == 250  # the node's, not the broker's
    flags.add(FLAG)
    hk.config_changed()
    events = hk.due(10, 0.1)
    assert [(e["name"], e["value"]) for e in events] == [("retry_backoff_ms", 250), ("worker_lost_s", 60.0)]
    for ev in events:
        r.batch(ev)
    hk.applied([{"ok": True}] * len(events))
    assert hk.due(20, 0.2) == [] and hk.lost_ms == 60_000

    node["worker_lost_s"] = 2.0  # `cluster config set`; not acted on before it is logged
    assert config.worker_lost_s == 60.0
    hk.config_changed()
    [change] = hk.due(30, 0.3)
    r.batch(change)
    hk.applied([{"ok": True}])
    assert config.worker_lost_s == 2.0 and hk.lost_ms == 2000
    assert config.task_settings()["default_lease_ms"] == SETTINGS["default_lease_ms"].default
    assert config.max_batch_events == 7  # not a task setting: the broker's own


def test_a_failover_keeps_the_logged_values_whatever_the_new_leaders_options(r):
    r.do("SettingChanged", name="default_lease_ms", value=5000, now_ms=1)
    successor = EffectiveConfig(own(default_lease_ms=99), lambda: r.store, lambda: {})
    assert successor.default_lease_ms == 5000
    assert checked({"default_lease_ms": 5000}) == {"default_lease_ms": 5000}
