"""EntryFuture behaves as a concurrent.futures.Future: results, callbacks, cancel, waits, threads."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest

from ledger.client.entry_future import EntryFuture, resolve_run


def test_result_and_callbacks_before_and_after():
    fut = EntryFuture()
    seen = []
    fut.add_done_callback(lambda f: seen.append(("early", f.result())))
    assert not fut.done() and not fut.running() and not fut.cancelled()
    fut.set_result(7)
    fut.add_done_callback(lambda f: seen.append(("late", f.result())))
    assert fut.done() and fut.result() == 7 and fut.exception() is None
    assert seen == [("early", 7), ("late", 7)]
    assert isinstance(fut, cf.Future)
    assert "finished returned int" in repr(fut)


def test_exception_is_raised_by_result():
    fut = EntryFuture()
    fut.set_exception(ValueError("no"))
    assert isinstance(fut.exception(), ValueError)
    with pytest.raises(ValueError):
        fut.result()
    with pytest.raises(cf.InvalidStateError):
        fut.set_result(1)
    assert "raised ValueError" in repr(fut)


def test_a_failing_callback_is_logged_and_the_others_run(caplog):
    fut = EntryFuture()
    seen = []
    fut.add_done_callback(lambda f: 1 / 0)
    fut.add_done_callback(lambda f: seen.append(f.result()))
    fut.set_result(3)
    assert seen == [3]
    assert "exception calling callback" in caplog.text


def test_cancel():
    fut = EntryFuture()
    seen = []
    fut.add_done_callback(seen.append)
    assert fut.cancel() and fut.cancel()
    assert fut.cancelled() and fut.done() and seen == [fut]
    with pytest.raises(cf.CancelledError):
        fut.result()
    with pytest.raises(cf.InvalidStateError):
        fut.set_result(1)
    assert not fut.set_running_or_notify_cancel()
    done = EntryFuture()
    done.set_result(1)
    assert not done.cancel()
    running = EntryFuture()
    assert running.set_running_or_notify_cancel() and running.running() and not running.cancel()
    running.set_result(2)
    assert running.result() == 2


def test_resolve_run_numbers_the_run_and_skips_cancelled():
    futs = [EntryFuture() for _ in range(4)]
    order = []
    for f in futs:
        f.add_done_callback(lambda f: order.append(f.result()))
    futs[2].cancel()
    order.clear()
    resolve_run(futs, 10)
    assert [f.result() for f in (futs[0], futs[1], futs[3])] == [10, 11, 13]
    assert futs[2].cancelled()
    assert order == [10, 11, 13]


def test_a_waiting_thread_is_woken_and_a_timeout_raises():
    fut = EntryFuture()
    with pytest.raises(cf.TimeoutError):
        fut.result(timeout=0.01)
    got = []
    waiter = threading.Thread(target=lambda: got.append(fut.result(timeout=5)))
    waiter.start()
    resolve_run([fut], 5)
    waiter.join(5)
    assert got == [5]


def test_concurrent_futures_wait_and_as_completed():
    futs = [EntryFuture() for _ in range(3)]
    done, not_done = cf.wait(futs, timeout=0.01)
    assert not done and len(not_done) == 3

    def later():
        resolve_run(futs[:2], 0)
        futs[2].set_exception(RuntimeError("x"))

    threading.Timer(0.05, later).start()
    done, not_done = cf.wait(futs, timeout=5)
    assert len(done) == 3 and not not_done
    assert sorted(f.result() for f in cf.as_completed(futs[:2], timeout=5)) == [0, 1]
    first = [EntryFuture(), EntryFuture()]
    threading.Timer(0.05, lambda: first[1].set_exception(RuntimeError("y"))).start()
    done, _ = cf.wait(first, timeout=5, return_when=cf.FIRST_EXCEPTION)
    assert done == {first[1]}


def test_callbacks_added_while_another_thread_resolves_all_run_once():
    for _ in range(50):
        futs = [EntryFuture() for _ in range(200)]
        calls = []
        resolver = threading.Thread(target=resolve_run, args=(futs, 0))
        resolver.start()
        for f in futs:
            f.add_done_callback(lambda f: calls.append(f.result()))
        resolver.join(5)
        assert sorted(calls) == list(range(200))
