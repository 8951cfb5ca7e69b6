"""A heartbeat's progress (``task.progress(fraction, note)``, the ``task_progress`` flag): checks and the gate.

A worker sends a handler's progress with the next heartbeat of its lease, as two optional fields
of a ``heartbeat`` request or of an item of a ``heartbeat_many``: ``progress`` (a number from 0.0
to 1.0) and ``note`` (a string of at most :data:`~broker.state.events.MAX_NOTE_CHARS`
characters, "" if left out; a note without a progress is refused). The same rule checks a
handler's call (:func:`progress_problem`, a ``ValueError`` there) and the request (a one-line
``bad_request``). The checked request carries ``progress: [fraction, note]`` or None.

While the cluster has not enabled ``task_progress`` the leader drops the progress
(:func:`drop_progress`) and extends the lease as before: a worker of this version heartbeats any
cluster, its handlers' progress is simply not recorded, and the log holds today's bytes. A leader
of an older version ignores the fields the same way.

Example::

    problem = progress_problem(0.5, "step 3 of 6")     # None: fine
    item = {**check_attempt(msg), "progress": check_progress(msg)}
"""

from __future__ import annotations

import math
from typing import Any, Callable

from broker.protocol import RequestError
from broker.state.apply_progress import unchanged
from broker.state.events import MAX_NOTE_CHARS
from election.wire import shown
from election.wire.codes import E_BAD_REQUEST

PROGRESS_FLAG = "task_progress"


def progress_problem(fraction: Any, note: Any) -> str | None:
    """What is wrong with a progress report (one line), or None if it is fine."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        return f"progress must be a number from 0.0 to 1.0, not {shown(fraction)}"
    if (isinstance(fraction, float) and math.isnan(fraction)) or not 0 <= fraction <= 1:
        return f"progress must be from 0.0 to 1.0, not {fraction!r}"
    if not isinstance(note, str):
        return f"a progress note must be a string, not {shown(note)}"
    if len(note) > MAX_NOTE_CHARS:
        return f"a progress note is at most {MAX_NOTE_CHARS} characters, not {len(note)}"
    try:
        note.encode("utf-8")
    except UnicodeEncodeError:
        return "a progress note must be valid text (it holds a lone surrogate)"
    return None


def progress_value(fraction: Any, note: Any) -> list:
    """``[fraction, note]`` as events carry it (a float, +0.0 for -0.0); ValueError if it is wrong."""
    problem = progress_problem(fraction, note)
    if problem is not None:
        raise ValueError(problem)
    return [float(fraction) + 0.0, note]


def check_progress(msg: dict) -> list | None:
    """The ``progress`` and ``note`` of a heartbeat (or heartbeat_many item) ``msg``, checked."""
    fraction, note = msg.get("progress"), msg.get("note")
    if fraction is None:
        if note is not None:
            raise RequestError(E_BAD_REQUEST, "a progress note needs a progress (0.0 to 1.0)")
        return None
    try:
        return progress_value(fraction, "" if note is None else note)
    except ValueError as exc:
        raise RequestError(E_BAD_REQUEST, str(exc)) from None


def drop_progress(req: dict) -> None:
    """Leave the progress out of a checked heartbeat or heartbeat_many (the flag is off)."""
    items = req["tasks"] if req["op"] == "heartbeat_many" else [req]
    for item in items:
        item["progress"] = None


def drop_unchanged(req: dict, get_task: Callable[[str], dict | None]) -> None:
    """Leave out each progress of a checked heartbeat that the task already records (the flag is on).

    ``get_task`` reads the leader's store, so a worker that sends a progress again (its reply lost
    in a failover) adds nothing to the log; the apply, which decides, ignores an unchanged one too.
    """
    items = req["tasks"] if req["op"] == "heartbeat_many" else [req]
    for item in items:
        if item.get("progress") is not None and unchanged(get_task(item["task_id"]), item):
            item["progress"] = None
