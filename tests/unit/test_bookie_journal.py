"""The bookie journal: its format, torn tails and damage, replay into the store, checkpoints."""

from __future__ import annotations

import os
import time

import pytest

from ledger.bookie.checkpoint import Checkpointer
from ledger.bookie.config import BookieConfig
from ledger.bookie.integrity import StoreRefused
from ledger.bookie.journal import Journal, delete_before, journal_files, read_state, write_state
from ledger.bookie.journal_format import (
    ALIGN,
    GROUP_HEADER,
    KIND_ADD,
    KIND_DELETE,
    KIND_FENCE,
    decode_group_header,
    decode_records,
    encode_add,
    encode_delete,
    encode_fence,
    encode_group,
    file_name,
    file_seq,
)
from ledger.bookie.journal_replay import JournalDamaged, open_journal, replay
from ledger.bookie.store import BookieStore
from tests.support.bookie_client import entry

pytestmark = pytest.mark.timeout(60)

INSTANCE = "a" * 32
MAP = 1 << 26


def run(ledger: int, first: int, count: int) -> list[bytes]:
    return [entry(ledger, i, lac=i - 1) for i in range(first, first + count)]


def snapshot(store: BookieStore) -> tuple:
    return list(store.scan()), store.records(), store.limbo()


def test_records_and_groups_round_trip():
    entries = run(3, 0, 3)
    group = encode_group(7, [encode_add(3, 0, 1, entries), encode_fence(4), encode_delete(5)])
    assert len(group) % ALIGN == 0
    head = decode_group_header(group, 0)
    assert (head.seq, head.count, head.size) == (7, 3, len(group))
    records = list(decode_records(group, GROUP_HEADER.size, head))
    assert [(r.kind, r.ledger) for r in records] == [(KIND_ADD, 3), (KIND_FENCE, 4), (KIND_DELETE, 5)]
    assert records[0].entries == entries and (records[0].first, records[0].lac) == (0, 1)
    assert records[1].entries == [] and records[1].lac == -1
    assert file_seq(file_name(12)) == 12 and file_seq("JOURNAL") is None


def test_a_flipped_byte_fails_the_record_crc():
    group = bytearray(encode_group(1, [encode_add(3, 0, -1, run(3, 0, 1))]))
    group[GROUP_HEADER.size + 30] ^= 0xFF
    head = decode_group_header(bytes(group), 0)
    with pytest.raises(Exception, match="crc32c"):
        list(decode_records(bytes(group), GROUP_HEADER.size, head))


def journal_dir(tmp_path, groups: list[list[bytes]], file_bytes: int = 1 << 20) -> tuple[str, Journal]:
    directory = str(tmp_path / "journal")
    os.makedirs(directory, exist_ok=True)
    journal = Journal(directory, INSTANCE, file_bytes, start_seq=1, fsync=False)
    for records in groups:
        journal.write_group(records)
    return directory, journal


def test_replay_applies_adds_fences_deletes_in_order_and_twice_gives_the_same_store(tmp_path):
    groups = [
        [encode_add(1, 0, -1, run(1, 0, 5)), encode_add(2, 0, -1, run(2, 0, 2))],
        [encode_fence(1)],
        [encode_add(1, 5, 4, run(1, 5, 1)), encode_delete(2), encode_add(3, 0, -1, run(3, 0, 1))],
    ]
    directory, journal = journal_dir(tmp_path, groups)
    journal.close()
    store = BookieStore(tmp_path / "store", map_size=MAP, sync=False)
    report = replay(directory, INSTANCE, (1, 0), store)
    assert (report.groups, report.records, report.entries, report.torn) == (3, 6, 9, None)
    once = snapshot(store)
    assert store.ledger_info(1) == {"fenced": True, "lac": 4, "last_entry": 5}
    assert store.ledger_info(2) is None and store.read(2, 0) is None
    assert store.read(1, 5) == run(1, 5, 1)[0]
    replay(directory, INSTANCE, (1, 0), store)
    assert snapshot(store) == once
    store.close()


def test_a_torn_last_group_is_dropped(tmp_path):
    directory, journal = journal_dir(tmp_path, [[encode_add(1, 0, -1, run(1, 0, 3))]])
    end = journal.position()[1]
    journal.write_group([encode_add(1, 3, 2, run(1, 3, 400))])  # spans many ALIGN blocks
    journal.close()
    path = os.path.join(directory, file_name(1))
    with open(path, "r+b") as fh:  # the group's first block never reached the disk, later ones did
        fh.seek(end)
        fh.write(bytes(ALIGN))
    store = BookieStore(tmp_path / "store", map_size=MAP, sync=False)
    report = replay(directory, INSTANCE, (1, 0), store)
    assert report.torn == f"{path} at offset {end}" and report.entries == 3
    assert store.ledger_info(1)["last_entry"] == 2
    store.close()


def test_a_record_cut_short_at_the_end_is_a_torn_tail(tmp_path):
    directory, journal = journal_dir(tmp_path, [[encode_add(1, 0, -1, run(1, 0, 3))], [encode_fence(1)]])
    end = journal.position()[1]
    journal.close()
    path = os.path.join(directory, file_name(1))
    with open(path, "r+b") as fh:  # the fence's record body is half zeros
        fh.seek(end - ALIGN + GROUP_HEADER.size + 10)
        fh.write(bytes(20))
    store = BookieStore(tmp_path / "store", map_size=MAP, sync=False)
    report = replay(directory, INSTANCE, (1, 0), store)
    assert report.torn is not None and report.records == 1
    assert store.ledger_info(1)["fenced"] is False
    store.close()


def test_a_bad_record_in_the_middle_names_the_file_and_offset(tmp_path):
    directory, journal = journal_dir(
        tmp_path,
        [[encode_add(1, 0, -1, run(1, 0, 3))], [encode_add(1, 3, 2, run(1, 3, 1))], [encode_fence(1)]],
    )
    journal.close()
    path = os.path.join(directory, file_name(1))
    second = ALIGN + decode_group_header(open(path, "rb").read(), ALIGN).size
    with open(path, "r+b") as fh:
        fh.seek(second + GROUP_HEADER.size + 40)
        fh.write(b"\xff\xff")
    store = BookieStore(tmp_path / "store", map_size=MAP, sync=False)
    with pytest.raises(JournalDamaged) as info:
        replay(directory, INSTANCE, (1, 0), store)
    assert info.value.path == path and info.value.offset == second
    assert f"journal file {path} is damaged at offset {second} (record fails its crc32c)" in str(info.value)
    assert "\n" not in str(info.value)
    store.close()


def test_damage_at_the_end_of_a_rolled_file_is_damage_not_a_tail(tmp_path):
    directory, journal = journal_dir(tmp_path, [], file_bytes=1 << 16)
    for i in range(40):  # about 1.3 KiB a group: rolls after some 45 of them
        journal.write_group([encode_add(1, i, i - 1, [entry(1, i, lac=i - 1, payload=bytes(1000))])])
    journal.close()
    assert len(journal_files(directory)) == 1
    journal = Journal(directory, INSTANCE, 1 << 16, start_seq=1 + 1, fsync=False)  # a restart's new file
    journal.write_group([encode_fence(1)])
    journal.close()
    path = journal_files(directory)[1]
    with open(path, "r+b") as fh:
        fh.seek(ALIGN + GROUP_HEADER.size + 20)
        fh.write(b"\xff")
    store = BookieStore(tmp_path / "store", map_size=MAP, sync=False)
    with pytest.raises(JournalDamaged, match="offset 512"):
        replay(directory, INSTANCE, (1, 0), store)
    store.close()


def test_rolls_and_replay_across_files_from_a_checkpoint(tmp_path):
    directory, journal = journal_dir(tmp_path, [], file_bytes=1 << 16)
    positions = []
    for i in range(200):
        positions.append(journal.position())
        journal.write_group([encode_add(1, i, i - 1, [entry(1, i, lac=i - 1, payload=bytes(1000))])])
    journal.close()
    assert len(journal_files(directory)) > 3 and journal.rolls == len(journal_files(directory))
    store = BookieStore(tmp_path / "store", map_size=MAP, sync=False)
    report = replay(directory, INSTANCE, positions[150], store)
    assert report.entries == 50 and store.read(1, 149) is None and store.read(1, 150) is not None
    assert delete_before(directory, positions[150][0]) == positions[150][0] - 1
    assert min(journal_files(directory)) == positions[150][0]
    store.close()


def config_for(tmp_path, **kw) -> BookieConfig:
    return BookieConfig(data=str(tmp_path / "data"), listen="tcp://127.0.0.1:3181", fsync=False, **kw)


def test_open_journal_replays_checkpoints_and_refuses_another_instance(tmp_path):
    cfg = config_for(tmp_path, journal_dir=str(tmp_path / "elsewhere"))
    store = BookieStore(cfg.data, map_size=MAP, sync=False)
    journal, report = open_journal(cfg, "b1", INSTANCE, store)
    assert report.records == 0 and store.journal_backed()
    store.add_runs([(1, 0, run(1, 0, 2), 0, False)])
    journal.write_group([encode_add(1, 0, 0, run(1, 0, 2)), encode_fence(1)])
    journal.close()
    store.close()
    os.unlink(os.path.join(cfg.data, "data.mdb"))  # the store lost it all: the journal has it

    store = BookieStore(cfg.data, map_size=MAP, sync=False)
    journal, report = open_journal(cfg, "b1", INSTANCE, store)
    assert report.records == 2 and store.ledger_info(1) == {"fenced": True, "lac": 0, "last_entry": 1}
    # Replayed, synced, checkpointed past: only the new file is left.
    assert list(journal_files(cfg.journal_path())) == [2]
    assert read_state(cfg.journal_path())["checkpoint"] == [2, ALIGN]
    journal.close()
    with pytest.raises(StoreRefused, match="belongs to store instance"):
        open_journal(cfg, "b1", "b" * 32, store)
    store.close()


def test_a_missing_journal_of_an_unclean_journaled_store_is_refused(tmp_path):
    cfg = config_for(tmp_path)
    store = BookieStore(cfg.data, map_size=MAP, sync=False)
    open_journal(cfg, "b1", INSTANCE, store)[0].close()
    store.clear_clean()
    for name in os.listdir(cfg.journal_path()):
        os.unlink(os.path.join(cfg.journal_path(), name))
    with pytest.raises(StoreRefused, match="its journal is missing"):
        open_journal(cfg, "b1", INSTANCE, store)
    store.mark_clean()  # after a clean close the store holds everything: a new journal is started
    open_journal(cfg, "b1", INSTANCE, store)[0].close()
    store.close()


def test_a_format_1_store_is_converted_on_open(tmp_path):
    store = BookieStore(tmp_path / "old", map_size=MAP)
    with store._env.begin(write=True) as txn:
        txn.put(b"format_version", b"1", db=store._meta)
    store.close()
    store = BookieStore(tmp_path / "old", map_size=MAP, sync=False)
    with store._env.begin() as txn:
        assert txn.get(b"format_version", db=store._meta) == b"2"
    assert not store.journal_backed()
    store.close()


def test_checkpointer_syncs_records_the_position_and_deletes_older_files(tmp_path):
    directory, journal = journal_dir(tmp_path, [], file_bytes=1 << 16)
    store = BookieStore(tmp_path / "store", map_size=MAP, sync=False)
    write_state(directory, INSTANCE, "b1", journal.position())
    checkpoints = Checkpointer(store, directory, INSTANCE, "b1", 1000.0, journal.position(), now=0.0)
    checkpoints.start()
    for i in range(100):
        journal.write_group([encode_add(1, i, i - 1, [entry(1, i, payload=bytes(1000))])])
        checkpoints.offer(journal.position(), now=1.0)  # not due by time: only a roll asks
    # The roll's checkpoint runs on the thread: wait for it, or close() would stop the thread first.
    deadline = time.monotonic() + 30
    while checkpoints.done < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    checkpoints.close(journal.position())
    assert checkpoints.done >= 2 and checkpoints.deleted_files >= 1
    assert read_state(directory)["checkpoint"] == list(journal.position())
    assert list(journal_files(directory)) == [journal.position()[0]]
    journal.close()
    store.close()
