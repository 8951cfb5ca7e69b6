"""The bookie's parked long polls (``ledger.bookie.polls.LongPolls``): answered when their ledger moves or at
their deadline, never before; time is the numbers the test passes."""

from __future__ import annotations

from ledger.bookie.polls import LongPolls


class Ledgers:
    """The replies' fields per ledger, and what was sent."""

    def __init__(self) -> None:
        self.lac: dict[int, int] = {}
        self.sent: list[tuple[list, dict]] = []

    def info(self, ledger: int) -> dict:
        return {"lac": self.lac.get(ledger, -1), "fenced": False}

    def send(self, route: list, reply: dict) -> None:
        self.sent.append((route, reply))

    def rids(self) -> list:
        return [reply["rid"] for _, reply in self.sent]


def make(limit: int = 100) -> tuple[LongPolls, Ledgers]:
    ledgers = Ledgers()
    return LongPolls(info=ledgers.info, send=ledgers.send, limit=limit), ledgers


def test_a_wake_that_does_not_pass_the_poll_leaves_it_parked():
    polls, ledgers = make()
    assert polls.park([b"p"], 1, ledger=4, after=-1, deadline=20.0)
    polls.wake(4)  # an add whose LAC is still -1
    polls.expire(19.9)
    assert ledgers.sent == [] and polls.waiting == 1
    ledgers.lac[4] = 0
    polls.wake(4)
    [(route, reply)] = ledgers.sent
    assert route == [b"p"] and (reply["ok"], reply["rid"], reply["lac"]) == (True, 1, 0)
    assert polls.waiting == 0


def test_a_wake_answers_only_its_own_ledgers_polls():
    polls, ledgers = make()
    polls.park([b"a"], 1, ledger=4, after=-1, deadline=20.0)
    polls.park([b"b"], 2, ledger=5, after=-1, deadline=20.0)
    ledgers.lac[4] = ledgers.lac[5] = 3
    polls.wake(4)
    assert ledgers.rids() == [1]


def test_a_poll_is_answered_at_its_deadline_and_not_before():
    polls, ledgers = make()
    polls.park([b"p"], 1, ledger=4, after=0, deadline=10.4)
    polls.park([b"q"], 2, ledger=4, after=0, deadline=30.0)
    polls.expire(10.39)
    assert ledgers.sent == []
    polls.expire(10.4)
    assert ledgers.rids() == [1] and ledgers.sent[0][1]["lac"] == -1
    ledgers.lac[4] = 1
    polls.wake(4)  # the expired poll is not answered twice
    assert ledgers.rids() == [1, 2]


def test_always_wakes_every_poll_of_the_ledger():
    polls, ledgers = make()
    polls.park([b"p"], 1, ledger=6, after=-1, deadline=20.0)
    polls.wake(6, always=True)  # a fence: the waiters learn of it at once
    assert ledgers.rids() == [1]


def test_the_loop_sleeps_no_longer_than_the_nearest_deadline():
    polls, _ = make()
    assert polls.timeout_ms(now=0.0, longest=100) == 100
    polls.park([b"p"], 1, ledger=4, after=0, deadline=5.5)
    assert polls.timeout_ms(now=5.0, longest=1000) == 501  # a millisecond past it, never short of it
    assert polls.timeout_ms(now=5.0, longest=100) == 100
    assert polls.timeout_ms(now=6.0, longest=100) == 0


def test_a_full_set_of_polls_refuses_another():
    polls, _ = make(limit=1)
    assert polls.park([b"p"], 1, ledger=4, after=0, deadline=5.0)
    assert not polls.park([b"q"], 2, ledger=4, after=0, deadline=5.0)


def test_a_woken_poll_carries_the_entries_it_asked_for():
    ledgers = Ledgers()
    polls = LongPolls(
        info=ledgers.info,
        send=ledgers.send,
        entries=lambda ledger, after, lac, n: {"entries": list(range(after + 1, min(lac, after + n) + 1))},
    )
    polls.park([b"p"], 1, ledger=8, after=1, deadline=20.0, max_entries=10)
    ledgers.lac[8] = 3
    polls.wake(8)
    assert ledgers.sent[0][1]["entries"] == [2, 3]
