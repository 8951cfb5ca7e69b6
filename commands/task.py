"""`fencepost submit` and `fencepost task show|list|cancel|retry`: submit a task, find tasks, act on one.

They only parse options and call :class:`broker.api.client.Client` (its operator calls,
:mod:`broker.api.operate`), then print a table or, with ``--json``, JSON. Times are the
leader's (milliseconds since the epoch in JSON, ages in tables).

Example::

    fencepost submit mail "hello" --key greeting-42 --expires 10m
    fencepost task list --queue mail --state dead --limit 20
    fencepost task retry 018bcfe5692cf3b1e4e270354efcba43

A task whose handler reported progress (``task.progress(fraction, note)``, the ``task_progress``
flag) shows it: a ``progress`` line in ``task show``, a PROGRESS column in ``task list`` (only
when a listed task has one), and ``progress: {fraction, note, attempt}`` in their JSON.
"""

from __future__ import annotations

import click

from broker.protocol import MAX_LIST_TASKS
from broker.state.events import CANCELLED, STATES
from commands.checks import DELAY, PRIORITY, QUEUE, WAIT
from commands.options import cluster_options, make_client
from commands.output import age, emit, first_line, printable_task, report_submit, table
from commands.queue import MAX_SETTING_S, Duration
from election.local.clock import SYSTEM_CLOCK


@click.command("submit")
@click.argument("queue", type=QUEUE)
@click.argument("payload", required=False)
@click.option("--key", default=None, help="Idempotency key: the same key returns the same task id.")
@click.option("--priority", default=0, show_default=True, type=PRIORITY, help="Higher runs first.")
@click.option("--delay", default=0.0, show_default=True, type=DELAY, help="Seconds before the task may run.")
@click.option(
    "--max-attempts", default=None, type=click.IntRange(1, 1000), help="Attempts before the task is dead."
)
@click.option(
    "--max-run",
    default=None,
    type=click.FloatRange(min=0.1),
    help="Seconds one attempt may run: past it the worker abandons it (killing a `worker run` command) "
    "and the leader expires its lease even if heartbeats go on.",
)
@click.option(
    "--retry-backoff",
    default=None,
    type=click.FloatRange(0, 1 << 30),
    help="Seconds before the first retry of a failed attempt, doubling for each later one [default: "
    "the queue's, else the brokers' retry_backoff_ms].",
)
@click.option(
    "--retry-backoff-max",
    default=None,
    type=click.FloatRange(0, 1 << 30),
    help="Longest wait between two attempts, in seconds [default: the queue's, else the brokers' "
    "retry_backoff_max_ms].",
)
@click.option(
    "--expires",
    default=None,
    type=Duration(0.001, MAX_SETTING_S),
    help="A task not started within this (90s, 10m, 2h, 7d) goes to expired and never runs [default: "
    "the queue's, else none]. Needs the cluster's task_expiry flag.",
)
@click.option(
    "--wait",
    "wait_s",
    default=None,
    type=WAIT,
    help="Wait up to this many seconds for the task to finish, then print its result; exit 1 unless "
    "it ended done.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object (with --wait: the task's record)."
)
@cluster_options
def submit(
    queue,
    payload,
    key,
    priority,
    delay,
    max_attempts,
    max_run,
    retry_backoff,
    retry_backoff_max,
    expires,
    wait_s,
    as_json,
    zk,
    cluster,
    dev_dir,
) -> None:
    """Submit a task to QUEUE; PAYLOAD is read from stdin when absent. Prints the task id once committed.

    With --wait, the id comes first, then the task's result once it is done; the exit code
    is 1 if it ended failed, dead or cancelled, or is still unfinished when the wait runs out.
    """
    data = payload.encode() if payload is not None else click.get_binary_stream("stdin").read()
    with make_client(zk, cluster, dev_dir) as client:
        task_id = client.submit(
            queue,
            data,
            key=key,
            priority=priority,
            delay=delay,
            max_attempts=max_attempts,
            max_run=max_run,
            retry_backoff=retry_backoff,
            retry_backoff_max=retry_backoff_max,
            expires=expires,
        )
        report_submit(client, task_id, wait_s, as_json)


def progress_text(progress: dict | None, attempts: int | None = None) -> str:
    """``42% note``, naming the attempt that reported it when it is not the task's last one."""
    if not progress:
        return ""
    text = f"{progress['fraction'] * 100:.0f}%"
    if progress.get("note"):
        text += f" {first_line(progress['note'])}"
    if attempts is not None and progress.get("attempt") != attempts:
        text += f" (attempt {progress['attempt']})"
    return text


@click.group("task")
def task() -> None:
    """Find tasks (list), look at one (show), cancel a waiting one, retry a failed or dead one."""


@task.command("show")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@cluster_options
def task_show(task_id, as_json, zk, cluster, dev_dir) -> None:
    """Show one task: queue, state, attempts, result, error."""
    with make_client(zk, cluster, dev_dir) as client:
        info = printable_task(client.get(task_id))

    def human(t):
        for name in (
            "id",
            "queue",
            "state",
            "attempts",
            "max_attempts",
            "priority",
            "worker",
            "result",
            "error",
            "will_retry",
            "progress",
        ):
            if name == "progress" and t.get(name) is not None:
                click.echo(f"{name:<13}{progress_text(t[name], t['attempts'])}")
            elif t.get(name) is not None:
                click.echo(f"{name:<13}{t[name]}")

    emit(info, as_json, human)


@task.command("cancel")
@click.argument("task_id")
@click.option(
    "--running",
    is_flag=True,
    help="Also revoke it if it runs: cancelled at once, its worker stops the handler on its next heartbeat "
    "and its late result is dropped (needs the revoke_running feature flag).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: task_id and state (cancelled).")
@cluster_options
def task_cancel(task_id, running, as_json, zk, cluster, dev_dir) -> None:
    """Cancel a task that is still waiting (a running task cannot be cancelled without --running: exit 1).

    Cancelling a task already cancelled succeeds again."""
    with make_client(zk, cluster, dev_dir) as client:
        client.cancel(task_id, running=running)
    emit({"task_id": task_id, "state": CANCELLED}, as_json, lambda r: click.echo(f"cancelled {task_id}"))


@task.command("list")
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
        now = SYSTEM_CLOCK.now()
        # PROGRESS only when a task of the page reported some (task_progress): else today's table.
        shows_progress = any(t.get("progress") for t in tasks)
        table(
            ["ID", "QUEUE", "STATE", "ATTEMPTS", "SUBMITTED", "FINISHED"]
            + (["PROGRESS"] if shows_progress else [])
            + ["ERROR"],
            [
                [
                    t["id"],
                    t["queue"],
                    t["state"],
                    f"{t['attempts']}/{t['max_attempts'] + (t.get('attempt_base') or 0)}",
                    age(t["submitted_ms"], now),
                    age(t["finished_ms"], now),
                ]
                + ([progress_text(t.get("progress"), t["attempts"])] if shows_progress else [])
                + [first_line(t.get("error"))]
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


@task.command("retry")
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
