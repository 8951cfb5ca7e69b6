"""`fencepost queue list|purge|requeue-dead`: each queue's depth by state; delete or requeue its tasks.

They only parse options and call :class:`broker.api.client.Client` (its operator calls,
:mod:`broker.api.operate`), then print a table or, with ``--json``, JSON.

Example::

    fencepost queue list
    fencepost queue purge mail --state done --older-than 7d
    fencepost queue requeue-dead mail
"""

from __future__ import annotations

import re

import click

from broker.state.events import FINAL_STATES, WAITING
from commands.checks import QUEUE
from commands.options import cluster_options, make_client
from commands.output import emit, table

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

    table(
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
