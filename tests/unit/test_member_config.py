"""The settings brokers and bookies share: one definition, one unit naming rule, one range each; old spellings."""

import dataclasses
import logging
import typing

import pytest

from broker.server.config import BrokerConfig, BrokerConfigError
from election.local.member_config import MemberConfig, unit_of_name
from election.local.settings import SettingsError, load_settings
from ledger import LedgerError
from ledger.bookie.config import BookieConfig

CONFIGS = [(BrokerConfig, BrokerConfigError, "broker"), (BookieConfig, LedgerError, "bookie")]
# What a kind may set for itself on a shared field (member_field): its default and how the default reads.
KIND_OWN = {"default_text"}


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def test_the_fields_both_configs_have_are_the_bases_and_agree():
    base, broker, bookie = _fields(MemberConfig), _fields(BrokerConfig), _fields(BookieConfig)
    assert set(broker) & set(bookie) == set(base)
    assert len(base) == 20
    hints = {cls: typing.get_type_hints(cls) for cls in (MemberConfig, BrokerConfig, BookieConfig)}
    for name, field in base.items():
        shared = {k: v for k, v in field.metadata.items() if k not in KIND_OWN}
        for cls, own in ((BrokerConfig, broker), (BookieConfig, bookie)):
            assert {k: v for k, v in own[name].metadata.items() if k not in KIND_OWN} == shared, (cls, name)
            assert hints[cls][name] == hints[MemberConfig][name], (cls, name)


@pytest.mark.parametrize("cls", [BrokerConfig, BookieConfig])
def test_every_field_with_a_unit_is_named_for_it(cls):
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        assert field.metadata.get("unit") == unit_of_name(field.name), field.name
        if hints[field.name] is float:
            assert field.metadata.get("unit") is not None, f"{field.name}: a duration without a unit"


@pytest.mark.parametrize("cls", [BrokerConfig, BookieConfig])
def test_former_names_lead_to_fields_and_are_no_fields_themselves(cls):
    names = set(_fields(cls))
    for old, new in cls.former_names.items():
        assert new in names and old not in names
        assert unit_of_name(new) is not None


def _bounds(cls):
    """(field, value, accepted) at each end of every field's range."""
    for field in dataclasses.fields(cls):
        low, high = field.metadata.get("min"), field.metadata.get("max")
        step = 1 if typing.get_type_hints(cls)[field.name] in (int, int | None) else 0.01
        if low is not None:
            yield field.name, low, not field.metadata.get("min_open")
            yield field.name, low - step, False
            yield field.name, low + step, True
        if high is not None:
            yield field.name, high, True
            yield field.name, high + step, False


def _valid(cls, name, value):
    changes = {name: value}
    if cls is BrokerConfig and name == "worker_lost_s":
        changes["worker_seen_s"] = 0.0  # worker_seen_s must stay below it
    if cls is BrokerConfig and name == "worker_seen_s" and value > 0:
        changes["worker_seen_s"] = max(value, 0.1)
    return cls(**changes)


@pytest.mark.parametrize("cls, error, _section", CONFIGS, ids=["broker", "bookie"])
def test_each_range_is_enforced_at_both_ends(cls, error, _section):
    checked = 0
    for name, value, accepted in _bounds(cls):
        config = _valid(cls, name, value)
        if accepted:
            config.validate()
        else:
            with pytest.raises(error, match=name):
                config.validate()
        checked += 1
    assert checked > 20


@pytest.mark.parametrize("cls, error, _section", CONFIGS, ids=["broker", "bookie"])
def test_the_shared_ranges_are_one_for_both(cls, error, _section):
    for value, accepted in ((0.3, False), (0.4, True), (600, True), (601, False)):
        config = cls(zk_session_timeout_s=value)
        if accepted:
            config.validate()
        else:
            with pytest.raises(error, match="zk_session_timeout_s must be between 0.4 and 600 seconds"):
                config.validate()
    with pytest.raises(error, match="max_frame_bytes"):
        cls(max_frame_bytes=512).validate()
    with pytest.raises(error, match="map_size_bytes"):
        cls(map_size_bytes=1 << 47).validate()


@pytest.mark.parametrize("cls, error, _section", CONFIGS, ids=["broker", "bookie"])
def test_a_value_of_the_wrong_type_is_refused(cls, error, _section):
    for name, value in (
        ("fsync", "yes"),
        ("max_frame_bytes", True),
        ("lost_bookie_grace_s", "60"),
        ("data", ""),
    ):
        with pytest.raises(error, match=name):
            cls(**{name: value}).validate()


RENAMED = [
    (BrokerConfig, "broker", "zk_session_timeout", "zk_session_timeout_s", 3.0),
    (BrokerConfig, "broker", "max_time_not_caught_up", "max_time_not_caught_up_s", 4.0),
    (BrokerConfig, "broker", "checkpoint_seconds", "checkpoint_s", 5.0),
    (BrokerConfig, "broker", "retention_seconds", "retention_s", 6.0),
    (BrokerConfig, "broker", "shutdown_timeout", "shutdown_timeout_s", 7.0),
    (BrokerConfig, "broker", "map_size", "map_size_bytes", 1 << 21),
    (BookieConfig, "bookie", "map_size", "map_size_bytes", 1 << 21),
]


@pytest.mark.parametrize("cls, section, old, new, value", RENAMED, ids=[f"{r[1]}-{r[2]}" for r in RENAMED])
def test_an_old_spelling_still_sets_the_field_and_warns(cls, section, old, new, value, tmp_path, caplog):
    absent = tmp_path / "absent.toml"
    caplog.set_level(logging.WARNING, logger="election.local.settings")
    config = load_settings(cls, section, flags={old: value}, env={}, toml_path=absent)
    assert getattr(config, new) == value
    old_flag, new_flag = "--" + old.replace("_", "-"), "--" + new.replace("_", "-")
    assert f"{old_flag} is deprecated: use {new_flag}" in caplog.text

    caplog.clear()
    config = load_settings(cls, section, env={f"FENCEPOST_{old.upper()}": str(value)}, toml_path=absent)
    assert getattr(config, new) == value
    assert f"FENCEPOST_{old.upper()} is deprecated: use FENCEPOST_{new.upper()}" in caplog.text

    caplog.clear()
    toml = tmp_path / "fencepost.toml"
    toml.write_text(f"[{section}]\n{old} = {value}\n")
    config = load_settings(cls, section, env={}, toml_path=toml)
    assert getattr(config, new) == value
    assert f"{old} in [{section}] of {toml} is deprecated: use {new}" in caplog.text


def test_the_new_spelling_wins_over_the_old_at_one_level_and_levels_keep_their_order(tmp_path, caplog):
    absent = tmp_path / "absent.toml"
    env = {"FENCEPOST_ZK_SESSION_TIMEOUT": "3", "FENCEPOST_ZK_SESSION_TIMEOUT_S": "4"}
    assert load_settings(BrokerConfig, "broker", env=env, toml_path=absent).zk_session_timeout_s == 4
    assert "FENCEPOST_ZK_SESSION_TIMEOUT is deprecated and ignored" in caplog.text
    # An old flag is still a flag: it beats the environment.
    config = load_settings(BrokerConfig, "broker", flags={"zk_session_timeout": 5}, env=env, toml_path=absent)
    assert config.zk_session_timeout_s == 5


def test_an_old_spelling_of_another_kinds_field_is_not_taken(tmp_path):
    # FENCEPOST_ZK_SESSION_TIMEOUT was the broker's alone: a bookie started from the same environment ignores it.
    env = {"FENCEPOST_ZK_SESSION_TIMEOUT": "3"}
    config = load_settings(BookieConfig, "bookie", env=env, toml_path=tmp_path / "absent.toml")
    assert config.zk_session_timeout_s == 10.0
    toml = tmp_path / "fencepost.toml"
    toml.write_text("[bookie]\nzk_session_timeout = 3\n")
    with pytest.raises(SettingsError, match="unknown keys"):
        load_settings(BookieConfig, "bookie", env={}, toml_path=toml)
