"""`fencepost`: the command-line interface's root group, its logging, and the groups it holds.

Each command group lives in its own module of :mod:`commands`, which only parses options and
calls the packages; this module adds them to the root group :func:`main` (the console script
``fencepost = cli:main``).

Exit codes: 0 success, 1 operation failed (one-line reason on stderr), 2 usage error.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import click

from commands.admin import admin
from commands.api import api
from commands.bench import bench
from commands.bookie import bookie
from commands.broker import broker_group
from commands.chaos import chaos
from commands.cluster import cluster_group
from commands.dev import dev
from commands.errors import FencepostGroup
from commands.keys import keys_group
from commands.pipeline import analyze, audit, export
from commands.queue import queue_group
from commands.schedule import schedule_group
from commands.shard import shard_group
from commands.snapshot import snapshot
from commands.status import dashboard, status
from commands.store import store
from commands.task import submit, task
from commands.worker import worker
from commands.zk import zk

# Fields a log call may attach with extra={...} that JSON lines carry as their own keys.
LOG_FIELDS = ("task_id", "queue", "attempt", "duration_ms", "outcome")


class JsonLogFormatter(logging.Formatter):
    """One JSON object per log line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "pid": record.process,
        }
        entry.update({name: getattr(record, name) for name in LOG_FIELDS if hasattr(record, name)})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(level: str, as_json: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonLogFormatter()
        if as_json
        else logging.Formatter("%(asctime)s %(levelname)-5s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("kazoo").setLevel(max(logging.WARNING, root.level))


@click.group(cls=FencepostGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--log-level",
    default=lambda: os.environ.get("FENCEPOST_LOG_LEVEL", "info"),
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    show_default="info",
    help="Log verbosity [env FENCEPOST_LOG_LEVEL].",
)
@click.option("--log-json", is_flag=True, default=False, help="Log JSON lines instead of text.")
def main(log_level: str, log_json: bool) -> None:
    """fencepost: a highly available, durable task broker.

    A leader broker, elected through ZooKeeper, writes every state change to
    fenced, quorum-replicated ledgers kept by bookies; followers tail them so
    any broker can take over without losing an acknowledged task.

    Start a local cluster with `fencepost dev up`, then `fencepost status`.
    """
    setup_logging(log_level, log_json or bool(os.environ.get("FENCEPOST_LOG_JSON")))


COMMANDS = (
    admin,
    analyze,
    api,
    audit,
    bench,
    bookie,
    broker_group,
    chaos,
    cluster_group,
    dashboard,
    dev,
    export,
    keys_group,
    queue_group,
    shard_group,
    snapshot,
    status,
    store,
    submit,
    task,
    worker,
    zk,
)
for _command in COMMANDS:
    main.add_command(_command)
main.add_command(schedule_group)


if __name__ == "__main__":
    main(prog_name="fencepost")
