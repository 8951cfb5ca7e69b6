"""`fencepost task list|retry`, `queue list|purge|requeue-dead`, `worker list`: find and act on tasks.

They only parse options and call :class:`broker.api.client.Client` (its operator calls,
:mod:`broker.api.operate`), then print a table or, with ``--json``, JSON. Times are the
leader's (milliseconds since the epoch in JSON, ages in tables).

Example::

    fencepost task list --queue mail --state dead --limit 20
    fencepost task retry 018bcfe5692cf3b1e4e270354efcba43
    fencepost queue purge mail --state done --older-than 7d
"""

from __future__ import annotations

import re
import time

import click

from broker.protocol import MAX_LIST_TASKS
from broker.state.events import FINAL_STATES, STATES, WAITING
from cli_checks import QUEUE
from cli_options import cluster_options, emit, make_client

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"\A(\d+(?:\.\d+)?)([smhdw]?)\Z")
# What `queue purge --state` names, as the states purged.
PURGE_STATES = {
    **{s: [s] for s in (WAITING,) + FINAL_STATES},
    "finished": list(FINAL_STATES),
    "all": [WAITING, *FINAL_STATES],
}


class Duration(click.ParamType):
    """A duration such as 90, 90s, 15m, 2h, 7d or 1.5w; in seconds."""

    name = "duration"

    def convert(self, value, param, ctx) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        match = _DURATION.match(str(value).strip())
        if not match:
            self.fail(f"{value!r} is not a duration (a number with s, m, h, d or w, e.g. 7d)", param, ctx)
        return float(match.group(1)) * _UNITS[match.group(2)]


def age(ms: int | None, now: float | None = None) -> str:
    """How long ago leader time ``ms`` was, in the largest unit that fits (``-`` for None)."""
    if ms is None:
        return "-"
    seconds = max(0.0, (now if now is not None else time.time()) - ms / 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _first_line(text: str | None, width: int = 60) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def _table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    for row in [header, *rows]:
        click.echo("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())


# ---------------------------------------------------------------- task list | retry
@click.command("list")
@click.option("--queue", type=QUEUE, default=None, help="Only this queue's tasks.")
@click.option("--state", type=click.Choice(STATES), default=None, help="Only tasks in this state.")
@click.option(
    "--limit",
    default=50,
    show_default=True,
    type=click.IntRange(1, MAX_LIST_TASKS),
    help="Tasks on this page.",
)
@click.option("--after", default=None, help="The cursor a previous page printed: the page after it.")
@click.option("--json", "as_json", is_flag=True, help="Print {tasks, next} as JSON.")
@cluster_options
def task_list(queue, state, limit, after, as_json, zk, cluster, dev_dir) -> None:
    """List tasks, by queue then submit order, a page at a time (from the leader's task index).

    A table, or with --json the tasks and `next`, the cursor of the next page. When
    there are more, the command for the next page is printed on stderr. Paging never
    lists a task twice, even while tasks change state.
    """
    with make_client(zk, cluster, dev_dir) as client:
        tasks, cursor = client.list_tasks(queue=queue, state=state, limit=limit, after=after)
    if as_json:
        emit({"tasks": tasks, "next": cursor}, True, None)
        return
    if not tasks:
        click.echo("no tasks")
    else:
        now = time.time()
        _table(
            ["ID", "QUEUE", "STATE", "ATTEMPTS", "SUBMITTED", "FINISHED", "ERROR"],
            [
                [
                    t["id"],
                    t["queue"],
                    t["state"],
                    f"{t['attempts']}/{t['max_attempts'] + (t.get('attempt_base') or 0)}",
                    age(t["submitted_ms"], now),
                    age(t["finished_ms"], now),
                    _first_line(t.get("error")),
                ]
                for t in tasks
            ],
        )
    if cursor is not None:
        click.echo(
            f"more: fencepost task list --after {cursor}"
            + (f" --queue {queue}" if queue else "")
            + (f" --state {state}" if state else "")
            + f" --limit {limit}",
            err=True,
        )


@click.command("retry")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@cluster_options
def task_retry(task_id, as_json, zk, cluster, dev_dir) -> None:
    """Send a failed or dead task back to waiting, with its max_attempts again.

    A task still waiting or running is left as it is (said so, exit 0); a done or
    cancelled one cannot be retried (exit 1).
    """
    with make_client(zk, cluster, dev_dir) as client:
        reply = client.retry(task_id)
    emit(
        reply,
        as_json,
        lambda r: click.echo(
            f"task {task_id} is already {r['state']}: nothing to retry"
            if r["duplicate"]
            else f"task {task_id} is waiting again (its next attempt is {r['attempt'] + 1})"
        ),
    )


# ---------------------------------------------------------------- queue list | purge | requeue-dead
@click.group("queue")
def queue_group() -> None:
    """Queues: their depth by state; purge finished (or waiting) tasks; requeue dead ones."""


@queue_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@cluster_options
def queue_list(as_json, zk, cluster, dev_dir) -> None:
    """Each queue: its tasks by state (from the leader's counters), and how long finished ones are kept."""
    with make_client(zk, cluster, dev_dir) as client:
        reply = client.queues()
    if as_json:
        emit(reply, True, None)
        return
    if not reply["queues"]:
        click.echo("no queues")
        return
    default = reply["result_ttl_ms"]

    def kept(q: dict) -> str:
        ttl = q.get("result_ttl_ms")
        ttl, where = (default, " (brokers)") if ttl is None else (ttl, "")
        return "forever" + where if not ttl else f"{_span(ttl / 1000)}{where}"

    _table(
        ["QUEUE", "WAITING", "DELAYED", "RUNNING", "DONE", "FAILED", "DEAD", "CANCELLED", "RESULTS KEPT"],
        [
            [
                q["queue"],
                *(
                    q["counts"].get(s, 0)
                    for s in ("waiting", "delayed", "running", "done", "failed", "dead", "cancelled")
                ),
                kept(q),
            ]
            for q in reply["queues"]
        ],
    )


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:g}s"


@queue_group.command("purge")
@click.argument("queue", type=QUEUE)
@click.option(
    "--state",
    "which",
    type=click.Choice(list(PURGE_STATES)),
    default="done",
    show_default=True,
    help="The tasks to delete: one state, finished (done, failed, dead, cancelled) or all (those and "
    "waiting). Running tasks are never purged.",
)
@click.option(
    "--older-than",
    type=Duration(),
    default=None,
    help="Only finished tasks that finished at least this long ago (90s, 15m, 2h, 7d).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@cluster_options
def queue_purge(queue, which, older_than, as_json, zk, cluster, dev_dir) -> None:
    """Delete QUEUE's tasks in a state for good (their idempotency keys become free again)."""
    states = PURGE_STATES[which]
    if older_than is not None and WAITING in states:
        raise click.BadParameter(
            "applies to finished tasks only: use --state finished (or one final state)",
            param_hint="--older-than",
        )
    with make_client(zk, cluster, dev_dir) as client:
        purged = client.purge(queue, states, older_than=older_than)
    emit(
        {"queue": queue, "states": states, "purged": purged},
        as_json,
        lambda r: click.echo(f"purged {purged} task(s) from {queue} ({', '.join(states)})"),
    )


@queue_group.command("requeue-dead")
@click.argument("queue", type=QUEUE)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@cluster_options
def queue_requeue_dead(queue, as_json, zk, cluster, dev_dir) -> None:
    """Send every dead task of QUEUE back to waiting, each with its max_attempts again."""
    with make_client(zk, cluster, dev_dir) as client:
        requeued = client.requeue_dead(queue)
    emit(
        {"queue": queue, "requeued": requeued},
        as_json,
        lambda r: click.echo(f"requeued {requeued} dead task(s) of {queue}"),
    )


# ---------------------------------------------------------------- worker list
@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@cluster_options
def worker_list(as_json, zk, cluster, dev_dir) -> None:
    """The workers the leader has heard from and not declared lost: queues, tasks in hand, last seen."""
    with make_client(zk, cluster, dev_dir) as client:
        workers = client.workers()
    if as_json:
        emit(workers, True, None)
        return
    if not workers:
        click.echo("no workers")
        return
    now = time.time()
    _table(
        ["WORKER", "QUEUES", "IN HAND", "LAST SEEN", "FIRST SEEN"],
        [
            [
                w["worker"],
                ",".join(w.get("queues") or []) or "-",
                w["in_hand"],
                age(w["last_seen_ms"], now),
                age(w["first_seen_ms"], now),
            ]
            for w in workers
        ],
    )
