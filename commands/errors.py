"""Every error of the `fencepost` command line on one line of stderr, and quiet ZooKeeper chatter.

:class:`FencepostGroup` is the root group's class: a usage error (a bad flag, an
out-of-range number, an invalid name) prints one line and exits 2; an error of the
packages, or of the system, prints one line and exits 1. A bug prints its type and
message on one line too (``--log-level debug`` logs the traceback). :func:`quiet_kazoo`
silences kazoo's per-retry warnings for commands that run once: a command that
cannot reach ZooKeeper fails with its own line, not a dozen warnings before it.

Example::

    @click.group(cls=FencepostGroup)
    def main(): ...

    $ fencepost submit mail x --delay -5
    fencepost: Invalid value for '--delay': -5.0 is not in the range x>=0. (see 'fencepost submit --help')
"""

from __future__ import annotations

import logging
import sys

import click
from kazoo.exceptions import KazooException

import broker
import election
import ledger
import pipeline
import snapshots
from election.wire import CodedError

log = logging.getLogger("fencepost.cli")

# Exit codes (README, "Exit codes").
EXIT_FAILED = 1
EXIT_USAGE = 2

# Errors whose message is the whole story: no traceback is worth showing for them.
_KNOWN_ERRORS = (
    broker.BrokerError,
    ledger.LedgerError,
    election.ElectionError,
    snapshots.SnapshotError,
    pipeline.PipelineError,
    CodedError,
    KazooException,
    ValueError,
    OSError,
)


def one_line(text: str) -> str:
    """``text`` with its lines joined, so an error never spreads over several lines."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip()) or "failed"


class OneLineError(click.ClickException):
    """A click error shown as one line ``fencepost: MESSAGE`` with its exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(one_line(message))
        self.exit_code = exit_code

    def show(self, file=None) -> None:
        click.echo(f"fencepost: {self.format_message()}", err=True)


def _usage(exc: click.UsageError) -> OneLineError:
    where = exc.ctx.command_path if exc.ctx is not None else "fencepost"
    return OneLineError(f"{exc.format_message()} (see '{where} --help')", EXIT_USAGE)


class FencepostGroup(click.Group):
    """The root group: one-line errors, exit 1 for failures and 2 for usage errors."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:  # a bad option of `fencepost` itself
            raise _usage(exc) from None

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, OneLineError):
            raise
        except click.UsageError as exc:
            raise _usage(exc) from None
        except click.ClickException as exc:
            raise OneLineError(exc.format_message(), exc.exit_code) from None
        except KeyboardInterrupt:
            raise OneLineError("interrupted", EXIT_FAILED) from None
        except BrokenPipeError:
            raise  # the reader went away (`| head`): click ends quietly
        except _KNOWN_ERRORS as exc:
            log.debug("command failed", exc_info=exc)
            raise OneLineError(str(exc) or type(exc).__name__, EXIT_FAILED) from None
        except Exception as exc:
            log.debug("command failed", exc_info=exc)
            raise OneLineError(
                f"internal error: {type(exc).__name__}: {exc} (--log-level debug shows where)", EXIT_FAILED
            ) from None


def quiet_kazoo() -> None:
    """Silence kazoo's connection warnings for the rest of a one-shot command (kept with --log-level debug)."""
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)


def fail(message: str) -> None:
    """Print a one-line reason and exit 1."""
    click.echo(f"fencepost: {one_line(message)}", err=True)
    sys.exit(EXIT_FAILED)
