"""Opening the journal at start: on a full disk the bookie starts read-only, and no crash in between refuses it."""

from __future__ import annotations

import errno
import os

import pytest

from ledger.bookie.config import BookieConfig
from ledger.bookie.journal import journal_files, read_state
from ledger.bookie.journal_format import ALIGN, encode_add
from ledger.bookie.journal_replay import open_journal
from ledger.bookie.store import BookieStore
from tests.support.bookie_client import entry

pytestmark = pytest.mark.timeout(60)

INSTANCE = "a" * 32
MAP = 1 << 26


@pytest.fixture
def cfg(tmp_path) -> BookieConfig:
    return BookieConfig(data=str(tmp_path / "data"), listen="tcp://127.0.0.1:3181", fsync=False)


@pytest.fixture
def store(cfg):
    store = BookieStore(cfg.data, map_size=MAP, sync=False)
    yield store
    store.close()


def no_space(*_args):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def journaled(cfg, store, count: int = 3) -> None:
    """A journal whose groups the store also holds, left as a SIGKILL leaves it (no checkpoint)."""
    journal, _ = open_journal(cfg, "b1", INSTANCE, store)
    for i in range(count):
        data = [entry(1, i, lac=i - 1)]
        store.add_runs([(1, i, data, i - 1, False)])
        journal.write_group([encode_add(1, i, i - 1, data)])
    journal.close()


def test_a_full_journal_disk_at_start_gives_a_read_only_journal_not_an_error(cfg, store, monkeypatch):
    journaled(cfg, store)
    with monkeypatch.context() as patched:
        patched.setattr(os, "posix_fallocate", no_space)
        journal, report = open_journal(cfg, "b1", INSTANCE, store)
        assert report.records == 3 and "No space left" in report.disk_full
        assert journal_files(cfg.journal_path()) == {}  # replayed and synced: the old files made room
        with pytest.raises(OSError) as info:
            journal.write_group([encode_add(1, 3, 2, [entry(1, 3, lac=2)])])
        assert info.value.errno == errno.ENOSPC
        with pytest.raises(OSError):
            journal.probe()
    journal.probe()  # space came back: the file is made where the checkpoint already points
    assert read_state(cfg.journal_path())["checkpoint"] == [list(journal_files(cfg.journal_path()))[0], ALIGN]
    journal.write_group([encode_add(1, 3, 2, [entry(1, 3, lac=2)])])
    journal.close()
    _, report = open_journal(cfg, "b1", INSTANCE, store)
    assert report.records == 1 and report.disk_full is None


def test_a_crash_after_the_old_files_went_and_before_the_checkpoint_moved_replays_nothing(cfg, store):
    journaled(cfg, store)
    state = read_state(cfg.journal_path())
    store.flush()  # as open_journal does before deleting them
    for path in journal_files(cfg.journal_path()).values():
        os.unlink(path)
    assert read_state(cfg.journal_path()) == state  # the checkpoint still names the deleted file
    journal, report = open_journal(cfg, "b1", INSTANCE, store)
    assert report.records == 0 and store.ledger_info(1)["last_entry"] == 2
    journal.close()


def test_a_crash_before_the_first_file_of_a_new_journal_is_made_is_not_taken_for_a_foreign_one(
    cfg, store, monkeypatch
):
    with monkeypatch.context() as patched:
        patched.setattr(os, "posix_fallocate", no_space)
        open_journal(cfg, "b1", INSTANCE, store)[0].close()  # as far as a crash there gets
    assert read_state(cfg.journal_path()) is not None and journal_files(cfg.journal_path()) == {}
    journal, report = open_journal(cfg, "b1", INSTANCE, store)
    assert report.records == 0 and list(journal_files(cfg.journal_path())) == [journal.position()[0]]
    journal.close()
