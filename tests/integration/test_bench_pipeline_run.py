"""`bench pipeline` end to end on a small history: the history it writes is legal, its snapshots cut
the audit into ranges, and the audit of that history is clean.

The bench runs as its own process (``python -m bench.pipeline --json``), with its own cluster and
Spark session, as an operator runs it. A history whose ``Outcomes`` named the wrong events of their
entries (indexes counted without the entry's ``StateDigest`` and earlier ``Outcomes``) audited clean
in one range, where a range replays the ``Outcomes`` and the grants together, and made
``attempt_skipped`` findings at every cut, where a range meets an ``Outcomes`` of the range before.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]


def test_a_small_history_with_snapshots_audits_clean_in_ranges():
    out = subprocess.run(
        [sys.executable, "-m", "bench.pipeline", "--json", "--events", "6000", "--ledgers", "2"]
        + ["--snapshots", "2", "--master", "local[2]"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert out.stdout, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["snapshots"] == 2 and result["audit_ranges"] == 3, result
    assert result["audit_findings"] == 0, result["audit_finding_kinds"]
    assert result["analyze_tasks"] > 0 and result["events"] >= 6000
