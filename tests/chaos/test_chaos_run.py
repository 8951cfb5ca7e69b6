"""`fencepost chaos` end to end: a 60-second seeded fault run on its own cluster finds no anomaly."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SEED = 20240607


@pytest.mark.chaos
@pytest.mark.timeout(420)
def test_sixty_second_chaos_run_has_faults_and_no_anomaly(tmp_path):
    run_dir = tmp_path / "chaos"
    done = subprocess.run([sys.executable, "-m", "cli", "chaos", "--seconds", "60", "--seed", str(SEED), "--json",
                           "--dir", str(run_dir)], cwd=REPO, capture_output=True, text=True, timeout=400)
    report = json.loads(done.stdout)
    assert report["seed"] == SEED
    assert report["faults"]["injected"] > 0, report["faults"]
    ops = report["operations"]
    # It found and checked acknowledged tasks and completions, and resubmitted every key.
    assert ops["keys_acknowledged"] > 100 and ops["tasks_checked"] >= ops["keys_acknowledged"]
    assert ops["completions_ok"] > 0
    assert ops["keys_resubmitted"] == ops["keys"]
    assert report["anomalies"] == [], f"{done.stderr[-2000:]}\n{json.dumps(report['anomalies'], indent=2)}"
    assert done.returncode == 0, done.stderr[-2000:]
    # Everything the run started is stopped.
    state = json.loads((run_dir / "cluster.json").read_text())
    assert state["processes"] == []
    assert not processes_mentioning(str(run_dir))


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line holds `text` (the run's directory: its members and workers)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_chaos_rejects_minutes_and_seconds_together():
    done = subprocess.run([sys.executable, "-m", "cli", "chaos", "--minutes", "1", "--seconds", "60"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not both" in done.stderr
