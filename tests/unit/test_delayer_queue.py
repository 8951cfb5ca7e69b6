"""The delayer's due-queue (which packet id a batch verdict releases when) and its argument errors."""

from __future__ import annotations

import pytest

from devtools.hosts.delayer import DueQueue, main

pytestmark = pytest.mark.timeout(30)


def test_nothing_is_due_before_its_delay() -> None:
    due = DueQueue(0.040)
    due.add(7, arrived=10.0)
    assert due.next_due() == pytest.approx(10.040)
    assert due.release(10.039) is None
    assert len(due) == 1


def test_release_names_the_last_due_id_and_forgets_those_before_it() -> None:
    due = DueQueue(0.040)
    for packet_id, arrived in ((1, 10.000), (2, 10.010), (3, 10.020)):
        due.add(packet_id, arrived)
    # One batch verdict for id 2 accepts 1 and 2 together.
    assert due.release(10.050) == 2
    assert due.next_due() == pytest.approx(10.060)
    assert due.release(10.055) is None
    assert due.release(10.060) == 3
    assert due.next_due() is None and len(due) == 0


def test_ids_keep_arrival_order_across_the_kernel_wraparound() -> None:
    # The kernel's ids are 32-bit and wrap: the last one due is still the last one that arrived.
    due = DueQueue(0.0)
    due.add(0xFFFFFFFF, 1.0)
    due.add(0, 1.0)
    assert due.release(1.0) == 0


def test_a_zero_delay_releases_at_arrival() -> None:
    due = DueQueue(0.0)
    due.add(4, arrived=3.0)
    assert due.release(3.0) == 4


def test_release_all_names_the_last_held_id() -> None:
    due = DueQueue(1.0)
    assert due.release_all() is None
    due.add(5, 0.0)
    due.add(6, 0.5)
    assert due.release_all() == 6
    assert len(due) == 0


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--queue-num", "70000", "--delay-ms", "40"], "--queue-num 70000 is not in 0-65535"),
        (["--queue-num", "1", "--delay-ms", "-5"], "--delay-ms -5 is not a finite number >= 0"),
        (["--queue-num", "1", "--delay-ms", "nan"], "--delay-ms nan is not a finite number >= 0"),
        (["--queue-num", "one", "--delay-ms", "40"], "invalid int value: 'one'"),
        (["--delay-ms", "40"], "the following arguments are required: --queue-num"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv: list[str], reason: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("delayer error: ") and reason in err
