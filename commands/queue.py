"""`fencepost queue list|declare|show|purge|requeue-dead`: each queue's depth by state; its settings;
delete or requeue its tasks.

They only parse options and call :class:`broker.api.client.Client` (its operator calls,
:mod:`broker.api.operate`), then print a table or, with ``--json``, JSON.

Example::

    fencepost queue list
    fencepost queue declare mail --max-attempts 8 --retry-backoff 2s --retry-backoff-max 10m --result-ttl 7d
    fencepost queue declare reports --expires 10m --max-waiting 10000 --overflow drop-oldest
    fencepost queue declare mailer --rate 100/s --max-running 8
    fencepost queue show mail --json
    fencepost queue purge mail --state done --older-than 7d
    fencepost queue requeue-dead mail
"""

from __future__ import annotations

import re

import click

from broker.protocol import MAX_ATTEMPTS, MAX_WAITING, MIN_LEASE_MS
from broker.state.events import (
    DEFAULT_MAX_ATTEMPTS,
    FINAL_STATES,
    MAX_RATE,
    MAX_SPAN_MS,
    OVERFLOW_POLICIES,
    WAITING,
)
from commands.checks import QUEUE
from commands.options import cluster_options, make_client
from commands.output import emit, table
from election.task_settings import SETTINGS as TASK_SETTINGS

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# A sign is matched so that a negative duration is told it is out of range, not that it is no duration.
_DURATION = re.compile(r"\A(-?\d+(?:\.\d+)?)([smhdw]?)\Z")
_RATE = re.compile(r"\A(\d+)/(\d+(?:\.\d+)?)?([smhd])\Z")
# What `queue purge --state` names, as the states purged.
PURGE_STATES = {
    **{s: [s] for s in (WAITING,) + FINAL_STATES},
    "finished": list(FINAL_STATES),
    "all": [WAITING, *FINAL_STATES],
}


class Duration(click.ParamType):
    """A duration such as 90, 90s, 15m, 2h, 7d or 1.5w; in seconds, from ``low`` to ``high``."""

    name = "duration"

    def __init__(self, low: float = 0.0, high: float | None = None) -> None:
        self.low, self.high = low, high

    def convert(self, value, param, ctx) -> float:
        if isinstance(value, (int, float)):
            seconds = float(value)
        else:
            match = _DURATION.match(str(value).strip())
            if not match:
                self.fail(f"{value!r} is not a duration (a number with s, m, h, d or w, e.g. 7d)", param, ctx)
            seconds = float(match.group(1)) * _UNITS[match.group(2)]
        if seconds < self.low or (self.high is not None and seconds > self.high):
            top = f" and at most {_span(self.high)}" if self.high is not None else ""
            self.fail(f"{value!r} is out of range: at least {_span(self.low)}{top}", param, ctx)
        return seconds


class Rate(click.ParamType):
    """A rate such as 100/s, 20/m, 500/h or 5/10s, as (count, seconds); 0 lifts the limit."""

    name = "rate"

    def convert(self, value, param, ctx) -> tuple[int, float]:
        if isinstance(value, tuple):
            return value
        text = str(value).strip()
        if text == "0":
            return (0, 1.0)
        match = _RATE.match(text)
        if not match:
            self.fail(f"{value!r} is not a rate (a count per s, m, h or d, e.g. 100/s or 20/m)", param, ctx)
        count, size, unit = int(match.group(1)), float(match.group(2) or 1), _UNITS[match.group(3)]
        if not 1 <= count <= MAX_RATE or size * unit * 1000 > MAX_SPAN_MS:
            self.fail(f"{value!r} is out of range: 1-{MAX_RATE} tasks per period", param, ctx)
        return (count, size * unit)


@click.group("queue")
def queue_group() -> None:
    """Queues: their depth by state; declare one's settings and show them; purge finished (or waiting)
    tasks; requeue dead ones."""


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
        [
            "QUEUE",
            "WAITING",
            "DELAYED",
            "RUNNING",
            "DONE",
            "FAILED",
            "DEAD",
            "CANCELLED",
            "EXPIRED",
            "RESULTS KEPT",
        ],
        [
            [
                q["queue"],
                *(
                    q["counts"].get(s, 0)
                    for s in (
                        "waiting",
                        "delayed",
                        "running",
                        "done",
                        "failed",
                        "dead",
                        "cancelled",
                        "expired",
                    )
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


# The longest a queue's time setting may be: ten years, a round bound within the state machine's spans.
MAX_SETTING_S = min(3650 * 86400, MAX_SPAN_MS // 1000)


def _cluster_default(name: str) -> str:
    """How the cluster-wide task setting ``name`` reads at its default (help texts)."""
    value = TASK_SETTINGS[name].default
    seconds = value / 1000 if name.endswith("_ms") else value
    return "kept" if name == "result_ttl_s" and not seconds else _span(seconds)


@queue_group.command("declare")
@click.argument("queue", type=QUEUE)
@click.option(
    "--max-attempts",
    type=click.IntRange(1, MAX_ATTEMPTS),
    default=None,
    help=f"Attempts a task of the queue gets before it is dead, 1 - {MAX_ATTEMPTS} [default: unchanged; "
    f"a new queue starts at {DEFAULT_MAX_ATTEMPTS}].",
)
@click.option(
    "--max-run",
    type=Duration(MIN_LEASE_MS / 1000, MAX_SETTING_S),
    default=None,
    help="How long one attempt may run, at least 0.1s: past it the worker abandons it (killing a "
    "`worker run` command) and the leader expires its lease even if heartbeats go on [default: "
    "unchanged; a new queue sets no limit].",
)
@click.option(
    "--retry-backoff",
    type=Duration(0, MAX_SETTING_S),
    default=None,
    help="Wait before the first retry of a failed attempt, twice as long for each later one; 0 retries "
    "at once [default: unchanged; unset: the cluster's retry_backoff_ms, "
    f"{_cluster_default('retry_backoff_ms')} unless configured].",
)
@click.option(
    "--retry-backoff-max",
    type=Duration(0, MAX_SETTING_S),
    default=None,
    help="Longest wait between two attempts [default: unchanged; unset: the cluster's "
    f"retry_backoff_max_ms, {_cluster_default('retry_backoff_max_ms')} unless configured].",
)
@click.option(
    "--result-ttl",
    type=Duration(0, MAX_SETTING_S),
    default=None,
    help="How long the queue's done, failed, dead and cancelled tasks are kept after they finished "
    "before the leader purges them; 0 keeps them, whatever the cluster's result_ttl_s [default: "
    f"unchanged; unset: the cluster's result_ttl_s, {_cluster_default('result_ttl_s')} unless "
    "configured].",
)
@click.option(
    "--expires",
    type=Duration(0, MAX_SETTING_S),
    default=None,
    help="The default expiry of the queue's tasks: one not started within it goes to expired and never "
    "runs (a task's own submit --expires wins); 0 sets none [default: unchanged; a new queue sets "
    "none]. Needs the cluster's task_expiry flag.",
)
@click.option(
    "--max-waiting",
    type=click.IntRange(0, MAX_WAITING),
    default=None,
    help="At most this many waiting tasks (delayed ones included) in each shard; 0 sets no limit "
    "[default: unchanged; a new queue has none]. Needs the cluster's queue_limits flag.",
)
@click.option(
    "--overflow",
    type=click.Choice(OVERFLOW_POLICIES),
    default=None,
    help="What a submit past --max-waiting does: reject (fails with queue_full), drop-oldest (the "
    "oldest waiting task is deleted) or dead-letter (it goes to dead) [default: unchanged; unset: "
    "reject]. Needs the cluster's queue_limits flag.",
)
@click.option(
    "--rate",
    type=Rate(),
    default=None,
    help="At most this many of its tasks leased per period, smoothly, across all workers of each "
    "shard: 100/s, 20/m, 500/h, 5/10s; 0 lifts it [default: unchanged; a new queue has none]. Needs "
    "the cluster's rate_limits flag.",
)
@click.option(
    "--max-running",
    type=click.IntRange(0, MAX_WAITING),
    default=None,
    help="At most this many of its tasks running at once in each shard (a fragile backend); 0 lifts "
    "it [default: unchanged; a new queue has none]. Needs the cluster's rate_limits flag.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: queue, created, settings.")
@cluster_options
def queue_declare(
    queue,
    max_attempts,
    max_run,
    retry_backoff,
    retry_backoff_max,
    result_ttl,
    expires,
    max_waiting,
    overflow,
    rate,
    max_running,
    as_json,
    zk,
    cluster,
    dev_dir,
) -> None:
    """Create QUEUE or change its settings: the defaults of its tasks (a task's own submit options win).

    A setting not given keeps its value; the queue is set on every shard. Durations are
    seconds, or a number with s, m, h, d or w (90, 1.5s, 15m, 7d), up to 3650d. Prints the
    queue's settings after the change (`queue show` adds its counts and the cluster's defaults).
    """
    from broker.api.queue_settings import declared

    with make_client(zk, cluster, dev_dir) as client:
        reply = client.declare_queue(
            queue,
            max_attempts=max_attempts,
            max_run=max_run,
            retry_backoff=retry_backoff,
            retry_backoff_max=retry_backoff_max,
            result_ttl=result_ttl,
            expires=expires,
            max_waiting=max_waiting,
            overflow=overflow,
            rate=rate,
            max_running=max_running,
        )
    view = {"queue": queue, "created": bool(reply.get("created")), "settings": declared(reply)}

    def human(v: dict) -> None:
        click.echo(f"{'created' if v['created'] else 'updated'} queue {queue}")
        _settings_lines(v["settings"], {})

    emit(view, as_json, human)


@queue_group.command("show")
@click.argument("queue", type=QUEUE)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object: queue, counts, settings (declared; null: unset), defaults (the "
    "cluster's) and effective (what its tasks act on); times in ms.",
)
@cluster_options
def queue_show(queue, as_json, zk, cluster, dev_dir) -> None:
    """QUEUE's settings (as declared, else the cluster's default, said so) and its tasks by state.

    Exit 1 if the cluster holds no record of QUEUE (nothing declared it or was submitted to it).
    """
    with make_client(zk, cluster, dev_dir) as client:
        view = client.queue(queue)

    def human(v: dict) -> None:
        click.echo(f"{'queue':<18} {v['queue']}")
        _settings_lines(v["settings"], v["defaults"])
        table([s.upper() for s in v["counts"]], [list(v["counts"].values())])

    emit(view, as_json, human)


def _shown(name: str, value: int) -> str:
    """A setting's value as a person reads it."""
    if name in ("max_attempts", "overflow"):
        return str(value)
    if name in ("max_waiting", "max_running"):
        return str(value) if value else "no limit"
    if name == "rate":
        per = _span(value[1] / 1000)
        return (
            f"{value[0]}/{per.removeprefix('1') if per in ('1s', '1m', '1h', '1d') else per}"
            if value[0]
            else "no limit"
        )
    if name == "result_ttl_ms" and not value:
        return "forever"
    if name == "expires_ms" and not value:
        return "none"
    return _span(value / 1000)


def _settings_lines(settings: dict, defaults: dict) -> None:
    """One line per setting: the declared value, else the cluster's (marked so) or "not set"."""
    for name, value in settings.items():
        label = name.removesuffix("_ms")
        if value is not None:
            click.echo(f"{label:<18} {_shown(name, value)}")
        elif defaults.get(name) is not None:
            click.echo(f"{label:<18} {_shown(name, defaults[name])} (cluster default)")
        elif name in ("max_run_ms", "expires_ms", "max_waiting", "rate", "max_running"):
            click.echo(f"{label:<18} none (not set)")
        else:
            click.echo(f"{label:<18} - (not set: the cluster's default)")


@queue_group.command("purge")
@click.argument("queue", type=QUEUE)
@click.option(
    "--state",
    "which",
    type=click.Choice(list(PURGE_STATES)),
    default="done",
    show_default=True,
    help="The tasks to delete: one state, finished (done, failed, dead, cancelled, expired) or all "
    "(those and waiting). Running tasks are never purged.",
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
