"""Shared helpers of the benchmarks: percentiles, output, the one-line failure.

The benchmarks' private clusters are :class:`bench.devbench.BenchCluster` (built
on the dev cluster of :mod:`devtools.devcluster`). The statistics helpers are pure
and unit-tested (``tests/unit/test_bench_common.py``).

Example::

    summary = latency_summary([0.0012, 0.0009, 0.0031])   # {"count": 3, "p50_ms": 1.2, ...}
    print(format_table(result))
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from typing import Any, Callable, Iterable, Sequence


class BenchError(RuntimeError):
    """The benchmark could not set up or run (a process did not start, too few bookies...)."""


# ----------------------------------------------------------------- statistics


def percentile(values: Sequence[float], p: float, presorted: bool = False) -> float:
    """The ``p``-th percentile (0-100) of ``values``, linearly interpolated between ranks.

    Same definition as ``numpy.percentile``'s default. NaN for an empty input.

    >>> percentile([1, 2, 3, 4], 50)
    2.5
    """
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be between 0 and 100, got {p}")
    if not values:
        return math.nan
    data = values if presorted else sorted(values)
    rank = (len(data) - 1) * p / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    frac = rank - low
    return data[low] + (data[high] - data[low]) * frac


def latency_summary(seconds: Iterable[float], prefix: str = "") -> dict:
    """Count, mean, p50, p90, p99, p99.9 and max of latencies given in seconds, reported in ms.

    Keys are ``<prefix>count``, ``<prefix>mean_ms``, ``<prefix>p50_ms``, ...;
    the values are rounded to microseconds and are None when there is no sample.
    """
    data = sorted(seconds)
    out: dict[str, Any] = {prefix + "count": len(data)}
    if not data:
        for key in ("mean_ms", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"):
            out[prefix + key] = None
        return out
    ms = lambda s: round(s * 1000.0, 3)  # noqa: E731
    out[prefix + "mean_ms"] = ms(sum(data) / len(data))
    for key, p in (("p50_ms", 50), ("p90_ms", 90), ("p99_ms", 99), ("p999_ms", 99.9)):
        out[prefix + key] = ms(percentile(data, p, presorted=True))
    out[prefix + "max_ms"] = ms(data[-1])
    return out


def rate(count: int, elapsed: float) -> float:
    """``count / elapsed`` rounded to 0.1, or 0.0 when nothing elapsed."""
    return round(count / elapsed, 1) if elapsed > 0 else 0.0


def median_of(results: Sequence[dict], key: str) -> float | None:
    """The median of ``key`` over several runs' result dicts (runs lacking it are skipped)."""
    values = [
        r[key] for r in results if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)
    ]
    return percentile(values, 50) if values else None


def median_dict(results: Sequence[dict], key: str) -> dict | None:
    """Per sub-key, the median of the ``key`` dicts of several runs (None where no run has a number).

    >>> median_dict([{"cpu": {"a": 1.0}}, {"cpu": {"a": 3.0}}, {"cpu": None}], "cpu")
    {'a': 2.0}
    """
    dicts = [r[key] for r in results if isinstance(r.get(key), dict)]
    if not dicts:
        return None
    names = list(dict.fromkeys(name for d in dicts for name in d))
    return {name: median_of(dicts, name) for name in names}


# ----------------------------------------------------------------- output


def machine_info() -> dict:
    """What the numbers were measured on."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


def to_json(result: dict) -> str:
    return json.dumps(result, indent=2, sort_keys=False, default=str)


def format_table(result: dict, labels: dict[str, str] | None = None) -> str:
    """A two-column, human-readable rendering of a flat result dict (nested dicts are indented)."""
    labels = labels or {}
    rows: list[tuple[str, str]] = []

    def walk(d: dict, indent: str) -> None:
        for key, value in d.items():
            label = indent + (labels.get(key, key) if not indent else key)  # labels name top-level keys only
            if isinstance(value, dict):
                rows.append((label, ""))
                walk(value, indent + "  ")
            elif isinstance(value, float):
                rows.append((label, f"{value:,.3f}" if abs(value) < 100 else f"{value:,.1f}"))
            elif isinstance(value, bool) or value is None:
                rows.append((label, {True: "yes", False: "no", None: "-"}[value]))
            else:
                rows.append((label, f"{value:,}" if isinstance(value, int) else str(value)))

    walk(result, "")
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{k.ljust(width)}  {v}".rstrip() for k, v in rows)


def emit(result: dict, as_json: bool, labels: dict[str, str] | None = None) -> None:
    print(to_json(result) if as_json else format_table(result, labels))


def finish(
    name: str, measure: Callable[[], dict], as_json: bool, labels: dict[str, str] | None = None
) -> int:
    """Run `measure` and print its result; a BenchError becomes one line on stderr and exit code 1."""
    try:
        result = measure()
    except BenchError as exc:
        print(f"bench {name}: {exc}", file=sys.stderr)
        return 1
    emit(result, as_json, labels)
    return 0


def finish_or_fail(
    name: str, measure: Callable[[], dict], as_json: bool, labels: dict[str, str] | None = None
) -> int:
    """:func:`finish`, and any other error also one line on stderr: exit code 1 (130 after Ctrl-C)."""
    try:
        return finish(name, measure, as_json, labels)
    except KeyboardInterrupt:
        print(f"bench {name}: interrupted", file=sys.stderr)
        return 130
    except (
        Exception
    ) as exc:  # LedgerError, SnapshotError, ...: one line, exit 1 (docs/operations.md, "Exit codes")
        print(f"bench {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
