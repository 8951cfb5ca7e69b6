"""Only ``election/local/clock.py`` reads time: every other module of the checked packages asks its Clock.

The check reads each module's AST: a reference to ``time.time``, ``time.monotonic``,
``time.sleep``, ``time.perf_counter`` or ``time.time_ns`` (and their ``_ns`` twins), called or
passed on, through any alias of the ``time`` module, or any of them imported from ``time``,
is a finding. Formatting helpers of ``time`` (``strftime``, ``gmtime``) read no clock.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The packages whose every timeout and schedule goes through an injected Clock.
CHECKED = ("broker", "election", "ledger", "snapshots", "pipeline")
THE_CLOCK = Path("election/local/clock.py")
READS_TIME = {"time", "monotonic", "sleep", "perf_counter", "time_ns", "monotonic_ns", "perf_counter_ns"}


def time_reads(source: str) -> list[str]:
    """``"line: what"`` for every place ``source`` reads time (or sleeps) without a clock."""
    tree = ast.parse(source)
    aliases = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update(a.asname or a.name for a in node.names if a.name == "time")
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            found += [f"{node.lineno}: from time import {a.name}" for a in node.names if a.name in READS_TIME]
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in READS_TIME
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return sorted(found, key=lambda f: int(f.split(":")[0]))


def checked_modules() -> list[Path]:
    return sorted(
        path.relative_to(ROOT)
        for package in CHECKED
        for path in (ROOT / package).rglob("*.py")
        if path.relative_to(ROOT) != THE_CLOCK
    )


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import time\nt = time.monotonic()\n", ["2: time.monotonic"]),
        ("import time as t\nf(clock=t.time)\n", ["2: t.time"]),
        ("from time import sleep as nap, strftime\n", ["1: from time import sleep"]),
        ("import time\ndef f():\n    time.sleep(1)\n", ["3: time.sleep"]),
        ("import time\nstamp = time.strftime('%Y')\n", []),
        ("clock.monotonic()\nself.time.sleep(1)\n", []),  # not the time module
    ],
)
def test_the_check_finds_time_read_through_the_module(source, expected):
    assert time_reads(source) == expected


def test_only_the_clock_reads_time():
    findings = {
        str(path): reads for path in checked_modules() if (reads := time_reads((ROOT / path).read_text()))
    }
    assert findings == {}, "read time through the injected Clock (election.local.clock) instead"


def test_the_clock_itself_is_the_one_exception():
    assert (ROOT / THE_CLOCK).exists() and time_reads((ROOT / THE_CLOCK).read_text())
    assert len(checked_modules()) > 50  # the packages are where this test expects them
