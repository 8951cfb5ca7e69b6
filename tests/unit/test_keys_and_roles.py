"""Keys, the keys file and roles: pure rules and files, no sockets."""

from __future__ import annotations

import stat

import pytest

from election.secure.keys import (
    KeyRing,
    KeysError,
    new_key_pair,
    parse_keys_file,
    read_key_pair,
    write_key_pair,
)
from election.secure.roles import allowed

pytestmark = pytest.mark.timeout(30)


def test_a_key_pair_round_trips_with_a_secret_file_only_its_owner_reads(tmp_path):
    pair = new_key_pair("worker", "thumbs")
    secret, public = write_key_pair(pair, tmp_path / "keys")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert read_key_pair(secret) == pair
    assert parse_keys_file(public.read_text())[pair.public].role == "worker"
    with pytest.raises(KeysError, match="never overwritten"):
        write_key_pair(pair, tmp_path / "keys")
    secret.chmod(0o644)
    with pytest.raises(KeysError, match="readable by others"):
        read_key_pair(secret)


def test_a_secret_file_whose_halves_do_not_match_is_refused(tmp_path):
    one, two = new_key_pair("admin", "a"), new_key_pair("admin", "b")
    secret, _ = write_key_pair(one, tmp_path)
    secret.write_text(secret.read_text().replace(one.public.decode(), two.public.decode()))
    with pytest.raises(KeysError, match="does not belong"):
        read_key_pair(secret)


@pytest.mark.parametrize(
    "line, message",
    [
        ("worker w1", "expected ROLE NAME PUBLIC-KEY"),
        ("wizard w1 " + "a" * 40, "unknown role"),
        ("worker bad/name " + "a" * 40, "invalid key name"),
        ("worker w1 tooshort", "not a 40-character"),
    ],
)
def test_a_bad_keys_file_line_is_named(line, message):
    with pytest.raises(KeysError, match=f"line 2: .*{message}"):
        parse_keys_file("# comment\n" + line + "\n")


def test_duplicate_keys_and_names_are_refused():
    key = new_key_pair("worker", "w").public.decode()
    with pytest.raises(KeysError, match="already listed on line 1"):
        parse_keys_file(f"worker w1 {key}\nadmin a1 {key}\n")
    other = new_key_pair("worker", "w").public.decode()
    with pytest.raises(KeysError, match="name 'w1' is already used"):
        parse_keys_file(f"worker w1 {key}\nworker w1 {other}\n")


def test_a_reload_that_fails_keeps_the_previous_keys(tmp_path):
    first, second = new_key_pair("producer", "p1"), new_key_pair("worker", "w1")
    path = tmp_path / "cluster.keys"
    path.write_text(first.public_line() + "\n")
    ring = KeyRing(path)
    assert ring.lookup(first.public).name == "p1" and ring.lookup(second.public) is None
    path.write_text(first.public_line() + "\n" + second.public_line() + "\n")
    assert ring.reload() == 2 and ring.lookup(second.public).role == "worker"
    path.write_text("garbage\n")
    with pytest.raises(KeysError):
        ring.reload()
    assert ring.lookup(second.public) is not None


@pytest.mark.parametrize(
    "role, server, op, expected",
    [
        ("producer", "broker", "submit", True),
        ("producer", "broker", "complete", False),
        ("worker", "broker", "complete_many", True),
        ("worker", "broker", "submit", False),
        ("worker", "broker", "purge_queue", False),
        ("producer", "broker", "purge_queue", False),
        ("admin", "broker", "purge_queue", True),
        ("admin", "broker", "cluster_shutdown", True),
        ("broker", "broker", "snapshot_chunk", True),
        ("broker", "broker", "submit", False),
        ("worker", "broker", "status", True),
        ("broker", "bookie", "fence", True),
        ("worker", "bookie", "read", False),
        ("producer", "bookie", "add", False),
        ("bookie", "bookie", "fence", False),
        ("admin", "bookie", "read", True),
    ],
)
def test_roles(role, server, op, expected):
    assert allowed(role, server, op) is expected


def test_a_hash_inside_a_key_is_part_of_the_key_not_a_comment():
    key = "a" * 39 + "#"
    assert parse_keys_file(f"# the workers\nworker w1 {key}\n")[key.encode()].name == "w1"
