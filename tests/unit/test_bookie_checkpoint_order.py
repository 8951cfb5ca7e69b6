"""A checkpoint never passes a journal record whose store write has not happened yet.

Replay after a crash starts at the last checkpoint, and the checkpoint's store sync covers
only the transactions committed before it. So a position may be offered to the checkpointer
only once the store holds everything journaled before it: a fence or a delete is journaled
*before* its store write, and a checkpoint offered in between would leave the acknowledged
fence neither in the synced store nor in the replayed journal (lost on a power cut).
"""

from __future__ import annotations

import os

import pytest

from election.wire.dispatch import RequestContext
from ledger.bookie.config import BookieConfig
from ledger.bookie.journal import Journal
from ledger.bookie.server import Bookie
from ledger.bookie.store import BookieStore
from tests.support.bookie_client import entry

pytestmark = pytest.mark.timeout(60)


class WorstCaseCheckpointer:
    """Takes every offer as a checkpoint due at once, and notes what the store held then."""

    def __init__(self, store: BookieStore, ledger: int) -> None:
        self.store, self.ledger = store, ledger
        self.seen: list[dict | None] = []
        self.done = 0

    def offer(self, position, now) -> None:
        self.seen.append(self.store.ledger_info(self.ledger))


@pytest.fixture
def bookie(tmp_path):
    bookie = Bookie(BookieConfig(data=str(tmp_path / "b"), listen="tcp://127.0.0.1:1", zk="127.0.0.1:1"))
    bookie._store = BookieStore(tmp_path / "store", map_size=1 << 24, sync=False)
    os.makedirs(tmp_path / "journal")
    bookie._journal = Journal(str(tmp_path / "journal"), "i" * 32, 1 << 16, start_seq=1, fsync=False)
    try:
        yield bookie
    finally:
        bookie._journal.close()
        bookie._store.close()


def context(op: str) -> RequestContext:
    return RequestContext(route=[b"peer"], rid=1, op=op, peer=None, received=0.0)


def test_a_fence_is_stored_before_a_checkpoint_can_pass_its_record(bookie):
    bookie._checkpoints = checkpoints = WorstCaseCheckpointer(bookie._store, 5)
    bookie._store.add_runs([(5, 0, [entry(5, 0)], -1, False)])
    reply = bookie._op_fence({"ledger": 5}, context("fence"))
    assert reply["ok"] and reply["fenced"] is True
    assert all(info is not None and info["fenced"] for info in checkpoints.seen), checkpoints.seen


def test_a_delete_is_stored_before_a_checkpoint_can_pass_its_record(bookie):
    bookie._checkpoints = checkpoints = WorstCaseCheckpointer(bookie._store, 6)
    bookie._store.add_runs([(6, 0, [entry(6, 0)], -1, False)])
    bookie._forget_ledger(6)
    assert bookie._store.ledger_info(6) is None
    assert all(info is None for info in checkpoints.seen), checkpoints.seen


def test_adds_are_stored_before_their_position_is_offered(bookie):
    bookie._checkpoints = checkpoints = WorstCaseCheckpointer(bookie._store, 7)
    bookie._kernel.send = lambda route, reply: None
    bookie._adds = [([b"peer"], 1, 7, 0, [entry(7, 0)], -1, False, False)]
    bookie._commit()
    assert checkpoints.seen and all(info and info["last_entry"] == 0 for info in checkpoints.seen)
