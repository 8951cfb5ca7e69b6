"""Cron expressions of periodic tasks (``fencepost schedule``), through the croniter library.

Pure: every function takes its times as arguments (milliseconds since the epoch, UTC) and reads
no clock. An expression has the five usual fields (minute, hour, day of month, month, day of
week), croniter's nicknames (``@hourly``, ``@daily``...), and optionally a sixth field: seconds,
last (croniter's order: ``* * * * * */10`` is every ten seconds). Times are UTC. ``H`` fields are
hashed with the schedule's name, so every leader computes the same occurrences for one schedule.

Occurrences are whole seconds. Only the leader computes them (to decide what to fire and when);
apply never does, so the state machine does not depend on croniter's version: what is replicated
is the occurrence the leader fired.

Example::

    check_cron("*/5 * * * *", "report", now_ms=1_764_691_200_000)   # CronError if bad or never due
    next_after("*/5 * * * *", 1_764_691_200_000, "report")          # 1_764_691_500_000
    between("* * * * * *", 0, 3_000, 10, "tick")                     # [1000, 2000, 3000]
"""

from __future__ import annotations

from datetime import datetime, timezone

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

# An expression is stored in the schedule's record, so its length is the event field's (UTF-8 bytes).
from broker.state.events import MAX_CRON_BYTES


class CronError(ValueError):
    """A cron expression that croniter refuses, or one that has no occurrence after now."""


def _iter(expr: str, start_ms: int, name: str, is_prev: bool = False) -> croniter:
    try:
        return croniter(expr, start_ms / 1000.0, ret_type=float, is_prev=is_prev, hash_id=name or "x")
    except (CroniterBadCronError, CroniterError, ValueError, KeyError, TypeError) as exc:
        raise CronError(f"invalid cron expression {expr!r}: {exc}") from None


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def check_cron(expr: str, name: str, now_ms: int) -> None:
    """Raise :class:`CronError` unless ``expr`` parses and has an occurrence after ``now_ms``."""
    if not isinstance(expr, str) or not expr.strip():
        raise CronError("cron must be a non-empty cron expression such as '*/5 * * * *'")
    if len(expr.encode("utf-8", "replace")) > MAX_CRON_BYTES:
        raise CronError(f"cron expression longer than {MAX_CRON_BYTES} bytes")
    if next_after(expr, now_ms, name) is None:
        after = f" after {_when(now_ms)}" if now_ms else ""
        raise CronError(f"cron expression {expr!r} has no occurrence{after}: it would never fire")


def next_after(expr: str, after_ms: int, name: str) -> int | None:
    """The first occurrence strictly after ``after_ms``, or None if there is none (``0 0 30 2 *``)."""
    it = _iter(expr, after_ms, name)
    try:
        return _ms(it.get_next(float))
    except CroniterBadDateError:
        return None
    except (CroniterError, ValueError, OverflowError) as exc:
        raise CronError(f"invalid cron expression {expr!r}: {exc}") from None


def latest_at_or_before(expr: str, at_ms: int, name: str) -> int | None:
    """The last occurrence at or before ``at_ms`` (occurrences are whole seconds), or None."""
    # croniter's previous occurrence is strictly before its start: start 1 ms later.
    it = _iter(expr, at_ms + 1, name, is_prev=True)
    try:
        found = _ms(it.get_prev(float))
    except CroniterBadDateError:
        return None
    except (CroniterError, ValueError, OverflowError) as exc:
        raise CronError(f"invalid cron expression {expr!r}: {exc}") from None
    return found if found <= at_ms else None


def between(expr: str, after_ms: int, until_ms: int, limit: int, name: str) -> list[int]:
    """The occurrences in ``(after_ms, until_ms]``, in order, at most ``limit`` of them."""
    out: list[int] = []
    if until_ms <= after_ms or limit <= 0:
        return out
    it = _iter(expr, after_ms, name)
    while len(out) < limit:
        try:
            t = _ms(it.get_next(float))
        except CroniterBadDateError:
            break
        if t > until_ms:
            break
        if t > after_ms:  # a float start rounds; never give back the start itself
            out.append(t)
    return out
