"""`fencepost chaos` output and exit codes, with the run itself replaced by a canned report."""

import json

from click.testing import CliRunner

import cli
from devtools import chaos, chaos_observe


def canned(anomalies):
    return {
        "seed": 5,
        "seconds": 60,
        "duration_s": 80.0,
        "run_dir": None,
        "faults": {
            "planned": 3,
            "injected": 2,
            "by_kind": {"kill_leader": 1, "poison": 1},
            "not_injected": {"kill_follower": 1},
            "skipped_kinds": {},
            "events": [],
        },
        "operations": {
            "submits_ok": 10,
            "submits_failed": 1,
            "keys": 10,
            "keys_acknowledged": 10,
            "completions_ok": 9,
            "completions_refused": 0,
            "tasks_checked": 10,
            "keys_resubmitted": 10,
            "queue_total": 10,
        },
        "poison_replies": {"bad_request": 3},
        "brokers": [],
        "anomalies": anomalies,
        "reproduce": "fencepost chaos --seconds 60 --seed 5",
    }


def run_with(monkeypatch, report, *args):
    seen = {}

    def fake_run(self):
        seen["config"] = self.config
        return report

    monkeypatch.setattr(chaos.ChaosRun, "run", fake_run)
    result = CliRunner().invoke(cli.main, ["chaos", *args])
    return result, seen["config"]


def test_clean_run_exits_0_and_prints_the_seed(monkeypatch):
    result, config = run_with(monkeypatch, canned([]), "--minutes", "2", "--seed", "5")
    assert result.exit_code == 0
    assert config.seconds == 120 and config.seed == 5
    assert "anomalies: 0" in result.output and "--seed 5" in result.output


def test_json_is_one_document(monkeypatch):
    result, config = run_with(monkeypatch, canned([]), "--seconds", "60", "--json")
    assert json.loads(result.output)["faults"]["injected"] == 2
    assert config.seconds == 60


def test_anomalies_exit_1_with_one_line_naming_them(monkeypatch):
    bad = [{"kind": "lost_task", "count": 2, "detail": "acknowledged task unknown to the leader: t1; t2"}]
    result, _ = run_with(monkeypatch, canned(bad), "--seconds", "60")
    assert result.exit_code == 1
    assert "lost_task (2)" in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("fencepost: 1 anomalies: lost_task (2)") and "seed 5" in last


def test_log_note_names_the_most_frequent_error(tmp_path):
    log = tmp_path / "bookie-0.log"
    trace = (
        "ERROR ledger.bookie.server: add batch failed\nTraceback (most recent call last):\n"
        '  File "x.py", line 1, in f\nlmdb.Error: mdb_txn_commit: Input/output error\n'
    )
    log.write_text("INFO serving\n" + trace * 3 + "Traceback (most recent call last):\nValueError: other\n")
    note = chaos_observe.log_note("bookie-0", log)
    assert note.startswith("bookie-0: 4 traceback/crash lines")
    assert "lmdb.Error: mdb_txn_commit: Input/output error (3)" in note


def test_log_note_is_empty_for_a_clean_log(tmp_path):
    log = tmp_path / "bookie-1.log"
    log.write_text("INFO serving\nWARNING is read-only: its store is full\n")
    assert chaos_observe.log_note("bookie-1", log) == ""


def test_hosts_and_cpu_per_host_reach_the_run(monkeypatch):
    report = {**canned([]), "hosts": 3}
    report["faults"] = {**report["faults"], "network": 4, "partitions": 3}
    result, config = run_with(monkeypatch, report, "--seconds", "60", "--hosts", "3", "--cpu-per-host", "0.5")
    assert result.exit_code == 0
    assert config.hosts == 3 and config.cpu_per_host == 0.5
    assert "on 3 test hosts" in result.output and "(3 partitions, 4 network faults)" in result.output


def test_cpu_per_host_needs_hosts():
    result = CliRunner().invoke(cli.main, ["chaos", "--seconds", "60", "--cpu-per-host", "0.5"])
    assert result.exit_code == 2 and "--cpu-per-host needs --hosts" in result.output


def test_shards_reach_the_run_and_the_report_names_them(monkeypatch):
    report = {**canned([]), "shards": 3}
    result, config = run_with(monkeypatch, report, "--seconds", "60", "--shards", "3")
    assert result.exit_code == 0 and config.shards == 3
    assert "with 3 shards" in result.output
    _, config = run_with(monkeypatch, canned([]), "--seconds", "60")
    assert config.shards == 1
