"""The pure helpers of bench/common.py: percentiles, latency summaries, rates, output."""

from __future__ import annotations

import json
import math
import random

import pytest

from bench.common import format_table, latency_summary, median_of, percentile, rate, to_json


def test_percentile_interpolates_like_numpy_default():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 0) == 1
    assert percentile([1, 2, 3, 4], 100) == 4
    assert percentile([10, 20, 30, 40, 50], 25) == 20
    assert percentile([0, 10], 99) == pytest.approx(9.9)


def test_percentile_ignores_input_order_and_single_value():
    data = list(range(1, 101))
    shuffled = data[:]
    random.Random(7).shuffle(shuffled)
    assert percentile(shuffled, 99) == pytest.approx(99.01)
    assert percentile([5.0], 99.9) == 5.0


def test_percentile_presorted_skips_sorting():
    assert percentile([1, 2, 3], 50, presorted=True) == 2


def test_percentile_empty_is_nan_and_bad_p_is_refused():
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1], 101)
    with pytest.raises(ValueError):
        percentile([1], -1)


def test_latency_summary_converts_seconds_to_ms():
    s = latency_summary([0.001, 0.002, 0.003, 0.004])
    assert s["count"] == 4
    assert s["mean_ms"] == 2.5
    assert s["p50_ms"] == 2.5
    assert s["max_ms"] == 4.0
    assert s["p99_ms"] == pytest.approx(3.97)
    assert list(s) == ["count", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"]


def test_latency_summary_empty_and_prefix():
    s = latency_summary([], prefix="zk_")
    assert s["zk_count"] == 0
    assert s["zk_p50_ms"] is None and s["zk_p99_ms"] is None


def test_rate_and_median_of_runs():
    assert rate(1000, 0.5) == 2000.0
    assert rate(10, 0) == 0.0
    runs = [{"x": 3.0}, {"x": 1.0}, {"x": 2.0}, {"y": 9}, {"x": True}]
    assert median_of(runs, "x") == 2.0
    assert median_of(runs, "missing") is None


def test_table_and_json_render_nested_results():
    result = {
        "entries_per_s": 21234.5,
        "fsync": True,
        "seconds": 10.0,
        "errors": 0,
        "nested": {"p50_ms": 1.25},
        "zk": None,
    }
    text = format_table(result, {"entries_per_s": "throughput (entries/s)"})
    lines = text.splitlines()
    assert lines[0].startswith("throughput (entries/s)") and lines[0].endswith("21,234.5")
    assert any(line.split() == ["fsync", "yes"] for line in lines)
    assert any(line.strip().startswith("p50_ms") and line.endswith("1.250") for line in lines)
    assert any(line.split() == ["zk", "-"] for line in lines)
    assert json.loads(to_json(result))["nested"]["p50_ms"] == 1.25
