"""election.secure.keyring: how a client finds the key to pin, and which settings make a process secure (pure, no sockets)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from election.secure.keyring import check_secure_settings, load_client_keys, server_name
from election.secure.keys import KeysError, new_key_pair, write_key_pair

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def files(tmp_path):
    pairs = [
        new_key_pair("producer", "shop"),
        new_key_pair("broker", "10.0.0.5:5601"),
        new_key_pair("worker", "10.0.0.6:5601"),
    ]
    for pair in pairs:
        write_key_pair(pair, tmp_path)
    (tmp_path / "cluster.keys").write_text("".join(p.public_line() + "\n" for p in pairs))
    return tmp_path / "shop.secret", tmp_path / "cluster.keys", pairs


def test_a_server_is_named_by_its_address():
    assert server_name("tcp://10.0.0.5:5601") == "10.0.0.5:5601"


def test_a_client_pins_the_key_listed_under_the_servers_address_with_a_server_role(files):
    key_file, keys_file, pairs = files
    keys = load_client_keys(key_file, keys_file)
    assert keys.pair.name == "shop"
    assert keys.server_public("tcp://10.0.0.5:5601") == pairs[1].public
    with pytest.raises(KeysError, match="no line named '10.0.0.7:5601'"):
        keys.server_public("tcp://10.0.0.7:5601")
    with pytest.raises(KeysError, match="role worker"):  # a client key posing as a server
        keys.server_public("tcp://10.0.0.6:5601")
    with pytest.raises(KeysError, match="not bookie"):
        keys.server_public("tcp://10.0.0.5:5601", ("bookie",))


def test_keys_come_from_the_arguments_then_the_environment_and_half_a_pair_is_refused(files):
    key_file, keys_file, _ = files
    assert load_client_keys(env={}) is None
    env = {"FENCEPOST_KEY_FILE": str(key_file), "FENCEPOST_KEYS_FILE": str(keys_file)}
    assert load_client_keys(env=env).pair.name == "shop"
    with pytest.raises(KeysError, match="keys file"):
        load_client_keys(key_file, env={})
    with pytest.raises(KeysError, match="a key file"):
        load_client_keys(keys_file=keys_file, env={})


def test_a_server_is_secure_with_both_settings_or_neither():
    check_secure_settings(SimpleNamespace(key_file="", keys_file=""), ValueError)
    check_secure_settings(SimpleNamespace(key_file="k", keys_file="f"), ValueError)
    with pytest.raises(ValueError, match="only key_file"):
        check_secure_settings(SimpleNamespace(key_file="k", keys_file=""), ValueError)
