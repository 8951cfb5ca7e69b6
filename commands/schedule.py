"""`fencepost schedule add|list|remove|pause|resume`: periodic tasks, each occurrence submitted once.

They only parse options and call the :class:`broker.api.client.Client`'s schedule calls
(:mod:`broker.api.schedule_calls`), then print text or, with ``--json``, JSON. A value that cannot
be right (a cron expression croniter refuses, a key template without an occurrence field) is a
usage error (exit 2) before the cluster is asked; a refusal by the leader (the ``schedules`` flag
not enabled, a name taken by another definition, an unknown schedule) exits 1 in one line.

Example::

    fencepost schedule add nightly --queue reports --cron "0 3 * * *" --payload '{"kind": "daily"}'
    fencepost schedule add tick --queue beats --cron "* * * * * *" --catch-up none --grace 10s
    fencepost schedule list --json
    fencepost schedule pause nightly && fencepost schedule resume nightly
    fencepost schedule remove nightly
"""

from __future__ import annotations

import base64
from datetime import datetime, timezone

import click

from broker.protocol import RequestError
from broker.protocol.cron import CronError, check_cron
from broker.protocol.schedules import (
    DEFAULT_CATCH_UP,
    DEFAULT_GRACE_MS,
    DEFAULT_KEY_TEMPLATE,
    MIN_GRACE_MS,
    check_name,
    check_template,
)
from broker.state.events import CATCH_UP_POLICIES, MAX_SPAN_MS
from commands.checks import PRIORITY, QUEUE
from commands.errors import fail
from commands.options import cluster_options, make_client
from commands.output import emit, table
from commands.queue import Duration


class ScheduleName(click.ParamType):
    name = "schedule"

    def convert(self, value, param, ctx) -> str:
        try:
            return check_name(value)
        except RequestError as exc:
            self.fail(exc.message, param, ctx)


class CronExpression(click.ParamType):
    name = "cron"

    def convert(self, value, param, ctx) -> str:
        try:
            check_cron(value, "check", 0)
        except CronError as exc:
            self.fail(str(exc), param, ctx)
        return value


NAME = ScheduleName()
_JSON = click.option("--json", "as_json", is_flag=True, help="Print the schedule(s) as JSON.")


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def printable(rec: dict) -> dict:
    """A schedule record for JSON: its payload as text when it is UTF-8, else base64."""
    payload = rec.get("payload") or b""
    out = dict(rec)
    try:
        out["payload"], out["payload_encoding"] = payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        out["payload"], out["payload_encoding"] = base64.b64encode(payload).decode(), "base64"
    return out


def _describe(rec: dict) -> None:
    state = "paused" if rec["paused"] else "active"
    click.echo(
        f"schedule {rec['name']} ({state}): queue {rec['queue']}, cron {rec['cron']!r} (UTC), catch-up "
        f"{rec['catch_up']}, grace {rec['grace_ms'] / 1000:g}s, key {rec['key_template']}"
    )
    if "next_ms" in rec:
        click.echo(f"  last fired {_when(rec['last_ms'])}, next {_when(rec['next_ms'])}")


@click.group("schedule")
def schedule_group() -> None:
    """Periodic tasks: a task submitted to a queue at each occurrence of a cron expression (UTC),
    exactly once across failovers; missed occurrences after an outage follow a catch-up policy."""


@schedule_group.command("add")
@click.argument("name", type=NAME)
@click.option("--queue", "queue", type=QUEUE, required=True, help="The queue each occurrence's task goes to.")
@click.option(
    "--cron",
    type=CronExpression(),
    required=True,
    help="When, in UTC: minute hour day-of-month month day-of-week, and optionally a 6th field, "
    "seconds (`* * * * * */10`: every ten seconds); @hourly, @daily... too.",
)
@click.option("--payload", default="", help="The tasks' payload (UTF-8 text) [default: empty].")
@click.option(
    "--key-template",
    default=DEFAULT_KEY_TEMPLATE,
    show_default=True,
    help="Each task's idempotency key: {name}, {queue}, {occurrence} (UTC, ISO 8601) or {occurrence_ms}; "
    "it must hold an occurrence field.",
)
@click.option(
    "--catch-up",
    type=click.Choice(CATCH_UP_POLICIES),
    default=DEFAULT_CATCH_UP,
    show_default=True,
    help="Occurrences missed for longer than the grace (a whole-cluster outage): fire all of them, "
    "only the last, or none.",
)
@click.option(
    "--grace",
    type=Duration(MIN_GRACE_MS / 1000, MAX_SPAN_MS / 1000),
    default=DEFAULT_GRACE_MS / 1000,
    show_default=True,
    help="An occurrence at most this late always fires, whatever --catch-up (a failover is far shorter).",
)
@click.option("--priority", type=PRIORITY, default=0, show_default=True, help="The tasks' priority.")
@click.option("--replace", is_flag=True, help="Change the schedule of this name if it exists.")
@_JSON
@cluster_options
def schedule_add(
    name,
    queue,
    cron,
    payload,
    key_template,
    catch_up,
    grace,
    priority,
    replace,
    as_json,
    zk,
    cluster,
    dev_dir,
) -> None:
    """Add schedule NAME (the same definition again changes nothing)."""
    try:
        check_template(key_template, name, queue)
    except RequestError as exc:
        raise click.BadParameter(exc.message, param_hint="--key-template") from None
    with make_client(zk, cluster, dev_dir) as client:
        rec = client.schedule(
            name,
            queue,
            cron,
            payload=payload,
            key_template=key_template,
            catch_up=catch_up,
            grace=grace,
            priority=priority,
            replace=replace,
        )
        rows = client.schedules(name)  # with its next occurrence
    if rows:
        rec = {**rows[0], "created": rec["created"], "replaced": rec["replaced"]}

    def human(r: dict) -> None:
        word = "replaced" if r.get("replaced") else "added" if r.get("created") else "unchanged:"
        click.echo(f"{word} schedule {name}")
        _describe(r)

    emit(printable(rec), as_json, human)


@schedule_group.command("list")
@click.argument("name", type=NAME, required=False)
@_JSON
@cluster_options
def schedule_list(name, as_json, zk, cluster, dev_dir) -> None:
    """Every schedule (or NAME): its definition, last occurrence fired and next one."""
    with make_client(zk, cluster, dev_dir) as client:
        rows = client.schedules(name)
    if name is not None and not rows:
        fail(f"no schedule {name!r}")
    if as_json:
        emit([printable(r) for r in rows], True, None)
        return
    if not rows:
        click.echo("no schedules")
        return
    table(
        ["NAME", "QUEUE", "CRON (UTC)", "CATCH-UP", "STATE", "LAST FIRED", "NEXT", "FIRED", "SKIPPED"],
        [
            [
                r["name"],
                r["queue"],
                r["cron"],
                r["catch_up"],
                "paused" if r["paused"] else "active",
                _when(r["last_ms"]),
                _when(r["next_ms"]),
                r["fired"],
                r["skipped"],
            ]
            for r in rows
        ],
    )


@schedule_group.command("remove")
@click.argument("name", type=NAME)
@_JSON
@cluster_options
def schedule_remove(name, as_json, zk, cluster, dev_dir) -> None:
    """Remove schedule NAME (the tasks it submitted stay); exit 1 if there is none."""
    with make_client(zk, cluster, dev_dir) as client:
        removed = client.remove_schedule(name)
    if as_json:
        emit({"name": name, "removed": removed}, True, None)
    elif removed:
        click.echo(f"removed schedule {name}")
    if not removed:
        fail(f"no schedule {name!r}")


def _pause_or_resume(name: str, pause: bool, as_json: bool, zk, cluster, dev_dir) -> None:
    with make_client(zk, cluster, dev_dir) as client:
        rec = client.pause_schedule(name) if pause else client.resume_schedule(name)
        rows = client.schedules(name)
    rec = rows[0] if rows else rec

    def human(r: dict) -> None:
        click.echo(f"{'paused' if pause else 'resumed'} schedule {name}")
        _describe(r)

    emit(printable(rec), as_json, human)


@schedule_group.command("pause")
@click.argument("name", type=NAME)
@_JSON
@cluster_options
def schedule_pause(name, as_json, zk, cluster, dev_dir) -> None:
    """Stop firing NAME until it is resumed."""
    _pause_or_resume(name, True, as_json, zk, cluster, dev_dir)


@schedule_group.command("resume")
@click.argument("name", type=NAME)
@_JSON
@cluster_options
def schedule_resume(name, as_json, zk, cluster, dev_dir) -> None:
    """Fire NAME again from its next occurrence; those that fell in the pause are skipped."""
    _pause_or_resume(name, False, as_json, zk, cluster, dev_dir)
