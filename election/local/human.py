"""Sizes and ages for people: what the text output of the commands shows (``--json`` keeps raw values).

Example::

    human_bytes(79982592000)        # "74.5 GiB"
    human_age(1795511419.5, now)    # "3s ago"
"""

from __future__ import annotations


def human_bytes(count) -> str:
    """``1536`` -> ``"1.5 KiB"``; ``None`` or a non-number -> ``"-"``. Pure."""
    if not isinstance(count, (int, float)) or isinstance(count, bool) or count < 0:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "-"  # not reached


def human_age(seconds_since_epoch, now: float) -> str:
    """How long before ``now`` a wall-clock time (seconds) was: ``"3s ago"``, ``"5m ago"``; ``"-"`` if unknown. Pure."""
    if not isinstance(seconds_since_epoch, (int, float)) or isinstance(seconds_since_epoch, bool):
        return "-"
    age = max(0.0, now - float(seconds_since_epoch))
    for limit, unit, size in ((120, "s", 1), (7200, "m", 60), (172800, "h", 3600)):
        if age < limit:
            return f"{int(age // size)}{unit} ago"
    return f"{int(age // 86400)}d ago"
