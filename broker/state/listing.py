"""Listing tasks page by page through the ``by_state`` index, and checking that index.

A page is read in one read transaction: for each queue (in name order, or the
one asked for) and each state asked for, one LMDB cursor is placed with
``set_range`` at (queue, state, the cursor's id) and the cursors are merged by
task id, so a queue's tasks come in id order (which is submit order) whatever
their states. A page therefore costs one seek per (queue, state) it visits plus
one step and one task read per task it returns: never a scan of what it skips.

The cursor of the next page is the last task returned, (queue, id), as an
opaque string. A task is returned at most once over all the pages of a
listing, whatever changes between them: its queue and id never change, and
every page starts after the previous one's last (queue, id). A task that
changed state is listed under its new state if it has not been passed yet; a
task submitted after the listing began is listed if its id comes later (ids
are time-ordered, so new tasks come at the end of their queue).

Verification checks the index against the task records
(:class:`broker.state.index_check.IndexCheck`).

Example::

    with env.begin() as txn:
        rows, cursor = task_page(txn, dbs, queue="mail", state="dead", limit=100)
        more, cursor = task_page(txn, dbs, queue="mail", state="dead", limit=100, after=decode_cursor(cursor))
"""

from __future__ import annotations

import base64
import binascii
import heapq
from typing import Any

import lmdb

from broker.state.events import MAX_NAME_BYTES, STATES
from broker.state.schema import STATE_KEY_CODE, queue_prefix, text, unpack
from broker.state.task_record import unpack_task
from broker.state.txn import StateCorrupt

# The longest error text a listed task carries (``task show`` has all of it).
LIST_ERROR_CHARS = 500
MAX_CURSOR_CHARS = 1024
# The fields of a task a listing returns (no payload or result: ``task show`` has them).
LIST_FIELDS = (
    "id",
    "queue",
    "state",
    "attempts",
    "max_attempts",
    "priority",
    "submitted_ms",
    "not_before_ms",
    "started_ms",
    "finished_ms",
    "worker",
    "error",
    "will_retry",
    "attempt_base",
)


class BadCursor(ValueError):
    """A listing cursor that this broker did not make."""


def encode_cursor(queue: str, task_key: bytes) -> str:
    """The cursor of a page ending at the task stored under ``task_key`` in ``queue``."""
    return base64.urlsafe_b64encode(queue_prefix(queue) + bytes(task_key)).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: Any) -> tuple[str, bytes]:
    """``(queue, task key)`` of a cursor made by :func:`encode_cursor`; :class:`BadCursor` otherwise."""
    if not isinstance(cursor, str) or not 0 < len(cursor) <= MAX_CURSOR_CHARS:
        raise BadCursor(f"a cursor is a string of 1-{MAX_CURSOR_CHARS} characters")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        queue_b, sep, task_key = raw.partition(b"\0")
        queue = queue_b.decode("utf-8")
    except (binascii.Error, ValueError):
        raise BadCursor(f"not a task list cursor: {cursor[:60]!r}") from None
    if not sep or not task_key or not 0 < len(queue_b) <= MAX_NAME_BYTES:
        raise BadCursor(f"not a task list cursor: {cursor[:60]!r}")
    return queue, task_key


def summary(rec: dict) -> dict:
    """What a listing shows of a task record (the error text cut to LIST_ERROR_CHARS)."""
    out = {name: rec.get(name) for name in LIST_FIELDS}
    if isinstance(out["error"], str) and len(out["error"]) > LIST_ERROR_CHARS:
        out["error"] = out["error"][: LIST_ERROR_CHARS - 3] + "..."
    if "progress" in rec:  # only when a handler reported one (task_progress), as in the record
        out["progress"] = rec["progress"]
    return out


def _queue_names(txn: lmdb.Transaction, dbs: dict, start: str | None):
    """Queue names with their records, in name order, from ``start`` (inclusive) on."""
    with txn.cursor(db=dbs["queues"]) as cur:
        found = cur.set_range(text(start)) if start is not None else cur.first()
        while found:
            yield bytes(cur.key()).decode("utf-8"), unpack(cur.value())
            found = cur.next()


def _merged(txn: lmdb.Transaction, dbs: dict, queue: str, states: list[str], after: bytes | None):
    """The task keys of ``queue`` in ``states``, in key order, strictly after ``after`` (a task key)."""
    heap: list[tuple[bytes, int]] = []
    cursors = []
    prefixes = []
    try:
        for i, state in enumerate(states):
            prefix = queue_prefix(queue) + STATE_KEY_CODE[state]
            cur = txn.cursor(db=dbs["by_state"])
            cursors.append(cur)
            prefixes.append(prefix)
            start = prefix + (after or b"")
            if not cur.set_range(start):
                continue
            key = bytes(cur.key())
            if after is not None and key == start and not cur.next():
                continue
            key = bytes(cur.key())
            if key.startswith(prefix):
                heap.append((key[len(prefix) :], i))
        heapq.heapify(heap)
        while heap:
            task_key, i = heapq.heappop(heap)
            yield task_key
            cur = cursors[i]
            if cur.next():
                key = bytes(cur.key())
                if key.startswith(prefixes[i]):
                    heapq.heappush(heap, (key[len(prefixes[i]) :], i))
    finally:
        for cur in cursors:
            cur.close()


def task_page(
    txn: lmdb.Transaction,
    dbs: dict,
    queue: str | None = None,
    state: str | None = None,
    limit: int = 100,
    after: tuple[str, bytes] | None = None,
) -> tuple[list[dict], str | None]:
    """One page of tasks (:func:`summary` of each) and the cursor of the next page (None: no more).

    ``queue``/``state`` filter (None: every queue, every state); ``after`` is a decoded cursor.
    Raises :class:`StateCorrupt` if the index names a task that does not exist.
    """
    states = [state] if state is not None else list(STATES)
    rows: list[dict] = []
    last: tuple[str, bytes] | None = None
    start = after[0] if after is not None else None
    if queue is not None:
        if start is not None and start > queue:
            return [], None  # the cursor is past this queue
        start = queue
    for name, qrec in _queue_names(txn, dbs, start):
        if queue is not None and name != queue:
            break
        wanted = [s for s in states if qrec["counts"].get(s, 0) > 0]
        if not wanted:
            continue
        if len(rows) >= limit:
            return rows, encode_cursor(*last)  # this queue holds more
        keys = _merged(txn, dbs, name, wanted, after[1] if after is not None and after[0] == name else None)
        try:
            for task_key in keys:
                if len(rows) >= limit:
                    return rows, encode_cursor(*last)  # one more exists: the next page starts after the last
                raw = txn.get(task_key, db=dbs["tasks"])
                if raw is None:
                    raise StateCorrupt(f"by_state lists a missing task {task_key!r:.60}")
                rows.append(summary(unpack_task(task_key, raw)))
                last = (name, task_key)
        finally:
            keys.close()
    return rows, None
