"""The cluster-wide options: only the options a member sets are compared with `config`;
the secret goes with hmac-sha256 only and is recognized by its check value, never stored."""

import dataclasses
import json

import pytest
from click.testing import CliRunner

import cli
from broker.server.config import BrokerConfig, BrokerConfigError
from election import ElectionError
from election.cluster_config import (
    SHARED_OPTIONS,
    ClusterOptions,
    SecretError,
    check_member_secret,
    check_secret_choice,
    member_options,
    new_config,
    option_differences,
    read_secret,
)
from election.local.settings import load_settings
from ledger import LedgerError
from ledger.bookie.config import BookieConfig

CONFIG = {"cluster_id": "c-1", "created_at": 1.0, **dataclasses.asdict(ClusterOptions())}


def test_unset_options_take_the_clusters_and_never_differ():
    assert option_differences(CONFIG, {name: None for name in SHARED_OPTIONS}) == []
    assert option_differences(CONFIG, member_options(BrokerConfig())) == []
    assert option_differences(CONFIG, member_options(BookieConfig())) == []


def test_only_set_options_are_compared_and_each_difference_is_named():
    mine = {
        "write_quorum": 2,
        "ack_quorum": None,
        "ensemble_size": 3,
        "digest": "hmac-sha256",
        "max_payload_bytes": None,
    }
    assert option_differences(CONFIG, mine) == [
        "write_quorum: cluster has 3, this member has 2",
        "digest: cluster has crc32c, this member has hmac-sha256",
    ]
    # The same values set explicitly agree.
    assert option_differences(CONFIG, {"write_quorum": 3, "digest": "crc32c"}) == []


def test_an_option_the_cluster_lacks_is_a_difference():
    assert option_differences({"cluster_id": "x"}, {"max_payload_bytes": 10}) == [
        "max_payload_bytes: cluster has nothing, this member has 10"
    ]


def test_cluster_options_compare_every_option():
    opts = ClusterOptions()
    assert opts.differences(CONFIG) == []
    assert opts.differences({**CONFIG, "ack_quorum": 3}) == ["ack_quorum: cluster has 3, this member has 2"]


def test_overrides_fill_the_defaults():
    assert ClusterOptions.with_overrides({"write_quorum": None, "ack_quorum": 1}) == ClusterOptions(
        ack_quorum=1
    )


@pytest.mark.parametrize("cls, error", [(BrokerConfig, BrokerConfigError), (BookieConfig, LedgerError)])
def test_member_configs_check_the_shared_options(cls, error):
    for bad in ({"write_quorum": 0}, {"digest": "md5"}, {"max_payload_bytes": 65 * 1024 * 1024}):
        with pytest.raises(error):
            cls(**bad).validate()
    cls(write_quorum=5, ack_quorum=3, ensemble_size=5, max_payload_bytes=100).validate()


def test_a_broker_with_hmac_needs_a_secret_file():
    with pytest.raises(BrokerConfigError, match="secret-file"):
        BrokerConfig(digest="hmac-sha256").validate()
    BrokerConfig(digest="hmac-sha256", secret_file="/some/file").validate()
    BookieConfig(digest="hmac-sha256").validate()  # bookies never verify an hmac: no secret


def test_environment_values_of_optional_numbers_are_converted():
    config = load_settings(
        BrokerConfig,
        "broker",
        env={"FENCEPOST_WRITE_QUORUM": "5", "FENCEPOST_INIT_IF_MISSING": "1"},
        toml_path="/nonexistent",
    )
    assert config.write_quorum == 5 and config.init_if_missing is True and config.ack_quorum is None


def test_generated_options_parse_the_shared_options():
    result = CliRunner().invoke(cli.main, ["broker", "start", "--digest", "md5"])
    assert result.exit_code == 2 and "--digest" in result.output
    result = CliRunner().invoke(cli.main, ["bookie", "start", "--write-quorum", "0"])
    assert result.exit_code == 2 and "--write-quorum" in result.output


def test_secret_goes_with_hmac_only(tmp_path):
    check_secret_choice(ClusterOptions(digest="hmac-sha256"), b"s")
    check_secret_choice(ClusterOptions(), None)
    with pytest.raises(SecretError, match="needs the cluster secret"):
        check_secret_choice(ClusterOptions(digest="hmac-sha256"), None)
    with pytest.raises(SecretError, match="only used with --digest hmac-sha256"):
        check_secret_choice(ClusterOptions(), b"s")
    empty = tmp_path / "empty"
    empty.write_bytes(b" \n")
    with pytest.raises(SecretError, match="is empty"):
        read_secret(empty)
    with pytest.raises(SecretError, match="cannot read"):
        read_secret(tmp_path / "missing")
    (tmp_path / "s").write_bytes(b"  hunter2-secret\n")
    assert read_secret(tmp_path / "s") == b"hunter2-secret"


def test_the_config_keeps_a_check_of_the_secret_never_the_secret():
    secret = b"a-cluster-secret-0123456789"
    config = new_config(ClusterOptions(digest="hmac-sha256"), clock=lambda: 5.0, secret=secret)
    text = json.dumps(config)
    assert secret.decode() not in text and secret.hex() not in text
    assert config["digest"] == "hmac-sha256" and len(config["secret_check"]) == 64
    assert check_member_secret(config, secret, "dev") == secret
    with pytest.raises(SecretError, match="not the secret of cluster"):
        check_member_secret(config, b"another-secret", "dev")
    with pytest.raises(SecretError, match="needs --secret-file"):
        check_member_secret(config, None, "dev")
    # crc32c: no secret is used, whatever the member holds.
    assert check_member_secret(new_config(ClusterOptions(), clock=lambda: 5.0), secret, "dev") is None


def test_new_config_validates_the_options():
    with pytest.raises(ElectionError):
        new_config(ClusterOptions(ack_quorum=4), clock=lambda: 1.0)
    config = new_config(ClusterOptions(write_quorum=5, ensemble_size=5), clock=lambda: 1.0)
    assert config["created_at"] == 1.0 and config["write_quorum"] == 5 and "secret_check" not in config


class _FakeZk:
    """Just enough of a kazoo client for the wait: `config` appears when the test says so."""

    def __init__(self):
        self.data = None
        self.watchers = set()

    def exists(self, path, watch=None):
        if watch is not None:
            self.watchers.add(watch)
        return object() if self.data is not None else None

    def get(self, path):
        from kazoo.exceptions import NoNodeError

        if self.data is None:
            raise NoNodeError()
        return self.data, None

    def create_config(self, config):
        self.data = json.dumps(config).encode()
        for watch in list(self.watchers):
            watch(None)


def test_the_wait_for_init_wakes_on_the_watch_and_ends_on_stop():
    import threading
    import time

    from election.cluster_config import wait_for_cluster_config
    from election.paths import ClusterPaths

    zk, stop = _FakeZk(), threading.Event()
    threading.Timer(0.3, zk.create_config, args=(CONFIG,)).start()
    started = time.monotonic()
    assert wait_for_cluster_config(zk, ClusterPaths("dev"), stop, poll_s=30.0) == CONFIG
    assert time.monotonic() - started < 2.0  # the watch, not the 30 s poll
    assert len(zk.watchers) == 1  # re-arming the watch adds no second watcher

    zk = _FakeZk()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    assert wait_for_cluster_config(zk, ClusterPaths("dev"), stop, poll_s=30.0) is None
    assert time.monotonic() - started < 2.0
