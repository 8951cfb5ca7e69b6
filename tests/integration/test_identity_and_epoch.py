"""Persistent broker ids and epoch claims against a real ZooKeeper."""

import json
import threading
import time

import pytest

from election.identity import META, META_TEMP, IdentityError, ensure_broker_id
from election.leader import claim_epoch, publish_leader, read_epoch, read_leader, retract_leader
from election.local.files import write_json_atomically

pytestmark = pytest.mark.integration


def test_first_start_takes_an_id_and_restart_keeps_it(cluster, tmp_path):
    a = ensure_broker_id(cluster.zk, cluster.paths, tmp_path / "a", "a", "tcp://127.0.0.1:1", clock=time.time)
    b = ensure_broker_id(cluster.zk, cluster.paths, tmp_path / "b", "b", "tcp://127.0.0.1:2", clock=time.time)
    assert (a.broker_id, b.broker_id) == (1, 2)
    again = ensure_broker_id(
        cluster.zk, cluster.paths, tmp_path / "a", "a", "tcp://127.0.0.1:9", clock=time.time
    )
    assert again == a
    record = json.loads(cluster.zk.get(cluster.paths.broker_id(1))[0])
    assert record["address"] == "tcp://127.0.0.1:9" and record["register_code"] == a.register_code
    assert not (tmp_path / "a" / META_TEMP).exists()


def test_crash_after_apply_before_rename_resumes_with_the_same_id(cluster, tmp_path):
    first = ensure_broker_id(cluster.zk, cluster.paths, tmp_path / "a", "a", "x", clock=time.time)
    # Simulate a crash between step 3 (ids/N created) and step 4 (rename): only the temp file remains.
    meta = json.loads((tmp_path / "a" / META).read_text())
    (tmp_path / "a" / META).unlink()
    write_json_atomically(tmp_path / "a" / META_TEMP, meta)
    resumed = ensure_broker_id(cluster.zk, cluster.paths, tmp_path / "a", "a", "x", clock=time.time)
    assert resumed == first
    assert json.loads(cluster.zk.get(cluster.paths.next_broker_id)[0]) == 2


def test_temp_file_whose_id_was_taken_gets_a_new_id(cluster, tmp_path):
    other = ensure_broker_id(cluster.zk, cluster.paths, tmp_path / "other", "o", "x", clock=time.time)
    (tmp_path / "a").mkdir()
    write_json_atomically(
        tmp_path / "a" / META_TEMP,
        {"cluster": cluster.name, "name": "a", "broker_id": other.broker_id, "register_code": "mine"},
    )
    mine = ensure_broker_id(cluster.zk, cluster.paths, tmp_path / "a", "a", "x", clock=time.time)
    assert mine.broker_id != other.broker_id and mine.register_code != "mine"


def test_data_dir_of_another_cluster_is_refused(cluster, tmp_path):
    (tmp_path / "a").mkdir()
    write_json_atomically(
        tmp_path / "a" / META, {"cluster": "elsewhere", "name": "a", "broker_id": 1, "register_code": "c"}
    )
    with pytest.raises(IdentityError, match="elsewhere"):
        ensure_broker_id(cluster.zk, cluster.paths, tmp_path / "a", "a", "x", clock=time.time)


def test_concurrent_starts_get_distinct_ids(cluster, tmp_path):
    ids, errors = [], []

    def start(i):
        try:
            ids.append(
                ensure_broker_id(
                    cluster.zk, cluster.paths, tmp_path / str(i), str(i), "x", clock=time.time
                ).broker_id
            )
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert sorted(ids) == list(range(1, 7))


def test_epoch_claims_are_unique_and_increasing(cluster):
    claimed = []
    threads = [
        threading.Thread(target=lambda i=i: claimed.append(claim_epoch(cluster.zk, cluster.paths, i).epoch))
        for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(claimed) == list(range(1, 9))
    assert read_epoch(cluster.zk, cluster.paths)[0] == 8


def test_leader_node_publish_and_retract(cluster):
    first = claim_epoch(cluster.zk, cluster.paths, 1)
    publish_leader(cluster.zk, cluster.paths, {"broker_id": 1, "address": "a", "epoch": first.epoch}, first)
    second = claim_epoch(cluster.zk, cluster.paths, 1)
    publish_leader(cluster.zk, cluster.paths, {"broker_id": 1, "address": "a", "epoch": second.epoch}, second)
    assert read_leader(cluster.zk, cluster.paths)["epoch"] == second.epoch
    retract_leader(cluster.zk, cluster.paths)
    assert read_leader(cluster.zk, cluster.paths) is None


@pytest.mark.parametrize(
    "content, field",
    [
        ('{"cluster": "%(c)s", "name": "a", "broker_id": "one", "register_code": "x"}', "broker_id"),
        ('{"cluster": "%(c)s", "name": "a", "broker_id": true, "register_code": "x"}', "broker_id"),
        ('{"cluster": "%(c)s", "name": "a", "register_code": "x"}', "broker_id"),
        ('{"cluster": "%(c)s", "name": "a", "broker_id": 1, "register_code": 7}', "register_code"),
        ('{"cluster": 3, "name": "a", "broker_id": 1, "register_code": "x"}', "cluster"),
        ('["not", "a", "map"]', "JSON object"),
        ('{"cluster": "%(c)s", "name": "a", "bro', "valid JSON"),
    ],
)
def test_damaged_broker_meta_is_named_with_its_field(cluster, tmp_path, content, field):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / META).write_text(content % {"c": cluster.name})
    with pytest.raises(IdentityError) as info:
        ensure_broker_id(cluster.zk, cluster.paths, tmp_path / "a", "a", "x", clock=time.time)
    message = str(info.value)
    assert str(tmp_path / "a" / META) in message and field in message and "\n" not in message


def test_ids_lost_with_zookeepers_data_are_registered_again_from_broker_meta(cluster, tmp_path):
    a = ensure_broker_id(cluster.zk, cluster.paths, tmp_path / "a", "a", "x", clock=time.time)
    b = ensure_broker_id(cluster.zk, cluster.paths, tmp_path / "b", "b", "x", clock=time.time)
    cluster.zk.delete(cluster.paths.brokers, recursive=True)  # as if ZooKeeper's data were re-created
    again_b = ensure_broker_id(cluster.zk, cluster.paths, tmp_path / "b", "b", "y", clock=time.time)
    again_a = ensure_broker_id(cluster.zk, cluster.paths, tmp_path / "a", "a", "y", clock=time.time)
    assert (again_a, again_b) == (a, b)
    for ident in (a, b):
        record = json.loads(cluster.zk.get(cluster.paths.broker_id(ident.broker_id))[0])
        assert record["register_code"] == ident.register_code and record["address"] == "y"
    # A newcomer never gets an id that a kept store still holds.
    c = ensure_broker_id(cluster.zk, cluster.paths, tmp_path / "c", "c", "z", clock=time.time)
    assert c.broker_id == 3


def test_a_lost_id_taken_by_another_broker_is_refused(cluster, tmp_path):
    a = ensure_broker_id(cluster.zk, cluster.paths, tmp_path / "a", "a", "x", clock=time.time)
    cluster.zk.delete(cluster.paths.brokers, recursive=True)
    ensure_broker_id(cluster.zk, cluster.paths, tmp_path / "new", "new", "x", clock=time.time)  # takes id 1
    with pytest.raises(IdentityError, match=f"broker id {a.broker_id} belongs to another broker"):
        ensure_broker_id(cluster.zk, cluster.paths, tmp_path / "a", "a", "x", clock=time.time)


def test_advance_ledger_ids_keeps_new_ledgers_above_a_kept_position(cluster):
    from ledger.metadata import advance_ledger_ids

    cluster.zk.ensure_path(cluster.paths.ledgers)
    used = advance_ledger_ids(cluster.zk, cluster.paths, above=1234)
    assert used >= 1234
    assert cluster.zk.get_children(cluster.paths.ledgers) == []
    created = cluster.zk.create(cluster.paths.ledgers + "/L", b"{}", sequence=True)
    assert cluster.paths.ledger_id_of(created.rsplit("/", 1)[1]) > 1234
    assert advance_ledger_ids(cluster.zk, cluster.paths, above=10) > used  # never backwards
