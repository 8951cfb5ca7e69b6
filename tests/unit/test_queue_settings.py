"""`queue show`'s view of one queue (declared settings, the cluster's defaults, what applies), the
options of `queue declare` refused before any cluster is reached, and `--json` on the commands that
print an outcome (issue 30 item 4)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import cli
from broker.api.queue_settings import COUNTED, SETTINGS, declared, queue_view

pytestmark = pytest.mark.timeout(60)

TASK_SETTINGS = {"retry_backoff_ms": 1000, "retry_backoff_max_ms": 300_000, "default_lease_ms": 30_000}


def test_a_declared_setting_wins_and_an_unset_one_is_the_cluster_s():
    row = {
        "queue": "mail",
        "max_attempts": 8,
        "lease_ms": 30_000,
        "retry_backoff_ms": 2000,
        "counts": {"waiting": 2, "dead": 1},
    }
    view = queue_view(row, default_ttl_ms=86_400_000, task_settings=TASK_SETTINGS)
    assert view["queue"] == "mail"
    assert view["settings"] == {
        "max_attempts": 8,
        "max_run_ms": None,
        "retry_backoff_ms": 2000,
        "retry_backoff_max_ms": None,
        "result_ttl_ms": None,
        "expires_ms": None,
        "max_waiting": None,
        "overflow": None,
        "rate": None,
        "max_running": None,
    }
    assert view["effective"] == {
        "max_attempts": 8,
        "max_run_ms": None,
        "retry_backoff_ms": 2000,
        "retry_backoff_max_ms": 300_000,
        "result_ttl_ms": 86_400_000,
        "expires_ms": None,
        "max_waiting": None,
        "overflow": "reject",
        "rate": None,
        "max_running": None,
    }
    # Every state is counted, those the record lacks as 0, in `queue list`'s order.
    assert list(view["counts"]) == list(COUNTED) and view["counts"]["waiting"] == 2
    assert sum(view["counts"].values()) == 3


def test_a_result_ttl_of_zero_is_declared_not_unset():
    view = queue_view({"queue": "q", "result_ttl_ms": 0, "max_attempts": 3}, 5000, {})
    assert view["settings"]["result_ttl_ms"] == 0 and view["effective"]["result_ttl_ms"] == 0
    # A leader that reports no task settings: the backoff default is unknown, not made up.
    assert view["defaults"]["retry_backoff_ms"] is None and view["effective"]["retry_backoff_ms"] is None


def test_declared_keeps_only_the_settings_that_act_on_tasks():
    reply = {"queue": "q", "created": True, "max_attempts": 3, "lease_ms": 30_000, "max_run_ms": 500}
    assert declared(reply) == {**dict.fromkeys(SETTINGS), "max_attempts": 3, "max_run_ms": 500}


@pytest.mark.parametrize(
    "args, named",
    [
        (["--max-attempts", "0"], "--max-attempts"),
        (["--max-attempts", "1001"], "--max-attempts"),
        (["--max-run", "0.05"], "--max-run"),
        (["--retry-backoff", "-1"], "--retry-backoff"),
        (["--retry-backoff-max", "soon"], "--retry-backoff-max"),
        (["--result-ttl", "3651d"], "--result-ttl"),
        (["--expires", "-1s"], "--expires"),
        (["--max-waiting", "-1"], "--max-waiting"),
        (["--overflow", "drop-newest"], "--overflow"),
        (["--rate", "fast"], "--rate"),
        (["--max-running", "-2"], "--max-running"),
    ],
)
def test_queue_declare_refuses_bad_values_with_exit_2_and_one_line(args, named):
    # The cluster named does not exist: a refusal at parse time never gets as far as looking.
    result = CliRunner().invoke(cli.main, ["queue", "declare", "mail", *args, "--zk", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and named in result.output


def test_queue_declare_reads_durations_with_units():
    from commands.queue import Duration

    assert [Duration(0, 3650 * 86400).convert(v, None, None) for v in ("90", "1.5s", "15m", "2h", "7d")] == [
        90.0,
        1.5,
        900.0,
        7200.0,
        604800.0,
    ]


@pytest.mark.parametrize(
    "command",
    [
        ["admin", "elect"],
        ["task", "cancel"],
        ["snapshot", "create"],
        ["snapshot", "restore"],
        ["zk", "start"],
        ["zk", "stop"],
        ["queue", "declare"],
        ["queue", "show"],
    ],
)
def test_the_commands_of_issue_30_take_json(command):
    result = CliRunner().invoke(cli.main, [*command, "--help"])
    assert result.exit_code == 0 and "--json" in result.output
