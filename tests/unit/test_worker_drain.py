"""SignalDrain: the first SIGTERM/SIGINT drains, the second stops at once; handlers are given back."""

from __future__ import annotations

import signal

from broker.api.drain import SIGNAL_EXIT_BASE, SignalDrain


def test_first_signal_drains_second_stops_and_exits_with_128_plus_signal():
    calls = []
    drain = SignalDrain(
        on_drain=lambda: calls.append("drain"),
        hard_stop=lambda: calls.append("hard"),
        exit_now=lambda code: calls.append(code),
    )
    before = signal.getsignal(signal.SIGTERM)
    assert drain.install()
    try:
        signal.raise_signal(signal.SIGTERM)
        assert calls == ["drain"] and drain.draining
        signal.raise_signal(signal.SIGINT)
        assert calls == ["drain", "hard", SIGNAL_EXIT_BASE + signal.SIGINT]
    finally:
        drain.restore()
    assert signal.getsignal(signal.SIGTERM) is before


def test_outside_the_main_thread_nothing_is_installed():
    import threading

    results = []
    thread = threading.Thread(target=lambda: results.append(SignalDrain(print, print).install()))
    thread.start()
    thread.join()
    assert results == [False]


def test_json_log_lines_carry_the_task_fields_of_a_finished_task():
    import json
    import logging

    from cli import JsonLogFormatter

    record = logging.LogRecord("broker.api.worker", logging.INFO, __file__, 1, "task %s done", ("t1",), None)
    for name, value in {
        "task_id": "t1",
        "queue": "mail",
        "attempt": 2,
        "duration_ms": 12.5,
        "outcome": "done",
    }.items():
        setattr(record, name, value)  # what log.info(..., extra={...}) does
    line = json.loads(JsonLogFormatter().format(record))
    assert line["msg"] == "task t1 done"
    assert {k: line[k] for k in ("task_id", "queue", "attempt", "duration_ms", "outcome")} == {
        "task_id": "t1",
        "queue": "mail",
        "attempt": 2,
        "duration_ms": 12.5,
        "outcome": "done",
    }
