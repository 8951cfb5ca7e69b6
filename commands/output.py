"""What the commands print: JSON or text, tables, ages, task records, and `submit`'s report.

Every command that prints data takes ``--json`` and hands it to :func:`emit`, which prints
JSON or the command's text formatter. Task records print with their bytes as text
(:func:`printable_task`). `submit` prints the task id first, on its own line, as soon as the
submit is committed; with ``--wait`` the result follows once the task is finished
(``--json``: one object with the id and the whole record), the exit code is 0 only when the
task ended ``done``, and a wait that runs out still printed the id, so a script can look the
task up later.

Example::

    $ id=$(fencepost submit mail hello)
    $ fencepost submit resize "$img" --wait 60 > thumb.png || echo "failed"
    $ fencepost submit mail hello --wait 10 --json | jq .task.state
"""

from __future__ import annotations

import base64
import json
from typing import Any, Callable

import click

from broker.api.requests import WaitTimeout
from commands.errors import fail
from election.local.clock import SYSTEM_CLOCK

DONE = "done"


def emit(data: Any, as_json: bool, human: Callable[[Any], None] | None) -> None:
    """Print `data` as JSON, or through the `human` formatter."""
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        human(data)


def table(header: list[str], rows: list[list[str]]) -> None:
    """Print ``rows`` under ``header`` in columns as wide as their widest cell."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    for row in [header, *rows]:
        click.echo("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())


def age(ms: int | None, now: float | None = None) -> str:
    """How long ago leader time ``ms`` was, in the largest unit that fits (``-`` for None)."""
    if ms is None:
        return "-"
    seconds = max(0.0, (now if now is not None else SYSTEM_CLOCK.now()) - ms / 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def first_line(text: str | None, width: int = 60) -> str:
    """The first line of ``text``, cut to ``width`` characters."""
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def printable_task(task: dict) -> dict:
    """A task record with its bytes as text (or ``base64:...`` when they are not UTF-8), for output."""
    out = {}
    for name, value in task.items():
        if isinstance(value, bytes):
            try:
                value = value.decode()
            except UnicodeDecodeError:
                value = "base64:" + base64.b64encode(value).decode()
        out[name] = value
    return out


def _outcome(task_id: str, task: dict) -> str:
    """The one-line reason a finished task is a failure of the command."""
    error = (task.get("error") or "").strip().splitlines()
    return f"task {task_id} ended {task.get('state')}" + (f": {error[0]}" if error else "")


def report_submit(client, task_id: str, wait_s: float | None, as_json: bool) -> None:
    """Print the submitted task's id, then (with ``wait_s``) wait for it and print its result; exit 1 unless done."""
    if not as_json:
        click.echo(task_id)
    if wait_s is None:
        if as_json:
            emit({"task_id": task_id, "task": None}, True, None)
        return
    try:
        task = client.wait(task_id, timeout=wait_s)
    except WaitTimeout as exc:
        if as_json:
            emit({"task_id": task_id, "task": printable_task(exc.task), "timed_out": True}, True, None)
        fail(f"task {task_id} still {exc.task.get('state')} after waiting {wait_s:g}s")
        return
    if as_json:
        emit({"task_id": task_id, "task": printable_task(task)}, True, None)
    elif task.get("state") == DONE and task.get("result") is not None:
        click.echo(task["result"])
    if task.get("state") != DONE:
        fail(_outcome(task_id, task))
