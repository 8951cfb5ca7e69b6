"""LedgerAhead: the takeover's ledger created on its own thread, taken or closed unused."""

import threading

import pytest

from broker.server.standing.ledger_ahead import LedgerAhead
from ledger import LedgerError


class FakeWriter:
    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id
        self.closed = threading.Event()

    def close(self, timeout: float | None = None) -> int:
        self.closed.set()
        return -1


class FakeLedgers:
    """Creates writers when released (so a test can hold the creation back)."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.release = threading.Event()
        self.fail = fail
        self.created: list[FakeWriter] = []
        self.epochs: list[int] = []

    def create(self, epoch: int) -> FakeWriter:
        self.epochs.append(epoch)
        assert self.release.wait(10)
        if self.fail is not None:
            raise self.fail
        writer = FakeWriter(len(self.created))
        self.created.append(writer)
        return writer


def test_the_writer_taken_is_the_one_created_for_the_epoch_and_is_not_closed():
    ledgers = FakeLedgers()
    ahead = LedgerAhead(ledgers, epoch=7)
    ledgers.release.set()
    writer = ahead.writer()
    ahead.discard()
    assert ledgers.epochs == [7] and writer is ledgers.created[0]
    assert not writer.closed.wait(0.2)


def test_a_ledger_of_a_takeover_that_failed_first_is_closed_once_created():
    ledgers = FakeLedgers()
    ahead = LedgerAhead(ledgers, epoch=3)
    ahead.discard()  # the takeover failed while the creation was still under way
    ledgers.release.set()
    for _ in range(100):
        if ledgers.created:
            break
        threading.Event().wait(0.05)
    assert ledgers.created and ledgers.created[0].closed.wait(10)


def test_a_failed_creation_is_raised_to_the_taker_and_ignored_by_discard():
    ledgers = FakeLedgers(fail=LedgerError("not enough bookies"))
    ledgers.release.set()
    ahead = LedgerAhead(ledgers, epoch=1)
    with pytest.raises(LedgerError, match="not enough bookies"):
        ahead.writer()
    failed = LedgerAhead(FakeLedgers(fail=LedgerError("gone")), epoch=2)
    failed._ledgers.release.set()
    failed.discard()  # nothing to close, nothing raised
