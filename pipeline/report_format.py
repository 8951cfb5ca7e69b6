"""How the analyze report writes values for people: times in UTC as ISO 8601, durations with units.

The tables keep times as ms since the epoch (``submitted_ms``, ``start_ms``, ...)
and durations as ms (``gap_ms``, ``start_p50_ms``, ...); the report shows the
first as ``2026-11-24T08:00:00.000Z`` and the second as ``2.50 s``. Which
columns are which is named here once, so every table of the report agrees.

Example::

    iso_time(1_764_000_000_000)         # '2025-11-24T16:00:00.000Z'
    duration(2_500)                     # '2.50 s'
    cell("start_ms", 1_764_000_000_000) # '2025-11-24T16:00:00.000Z'
    header("start_ms")                  # 'start (UTC)'
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# Columns (and summary keys) holding a moment, in ms since the epoch.
TIME_COLUMNS = frozenset(
    {
        "since_ms",
        "until_ms",
        "submitted_ms",
        "first_start_ms",
        "finished_ms",
        "minute_ms",
        "start_ms",
        "end_ms",
        "ledger_created_ms",
    }
)
# Columns holding a length of time, in ms.
DURATION_COLUMNS = frozenset(
    {
        "gap_ms",
        "leader_gap_ms",
        "longest_gap_ms",
        "busy_ms",
        "window_ms",
        *(f"{kind}_p{p}_ms" for kind in ("start", "finish") for p in (50, 90, 99)),
    }
)


def moment(ms: int) -> datetime:
    """ms since the epoch as an aware UTC datetime, exact to the ms (no float rounding)."""
    return EPOCH + timedelta(milliseconds=int(ms))


def iso_time(ms: int | None) -> str:
    """A moment as ISO 8601 in UTC with ms (``Z``); empty for None."""
    if ms is None:
        return ""
    return moment(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def duration(ms: float | None) -> str:
    """A length of time for people: ``850 ms``, ``2.50 s``, ``3 min 12 s``, ``2 h 5 min``; empty for None."""
    if ms is None:
        return ""
    if abs(ms) < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if abs(seconds) < 60:
        return f"{seconds:.2f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def count(value: int | None) -> str:
    """A count with thousands separators (``26,000``)."""
    return "" if value is None else f"{value:,}"


def cell(column: str, value: object) -> str:
    """A table cell: a time or a duration by its column, a float to one decimal, anything else as text."""
    if value is None:
        return ""
    if column in TIME_COLUMNS:
        return iso_time(value)
    if column in DURATION_COLUMNS:
        return duration(value)
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:,.2f}" if column == "utilization" else f"{value:,.1f}"
    return str(value)


def header(column: str) -> str:
    """A column's heading: a time column says it is UTC, a duration column loses its unit (the cells say it)."""
    if column in TIME_COLUMNS:
        return column.removesuffix("_ms") + " (UTC)"
    if column in DURATION_COLUMNS:
        return column.removesuffix("_ms")
    return column
