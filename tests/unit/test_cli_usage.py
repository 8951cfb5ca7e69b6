"""Usage errors exit 2 and package errors exit 1, each with one line naming the problem."""

import pytest
from click.testing import CliRunner

import cli


def test_bad_flag_exits_2_with_one_line_pointing_at_the_help():
    result = CliRunner().invoke(cli.main, ["dev", "up", "--no-such-flag"])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1
    assert "No such option" in result.output and "dev up --help" in result.output


def test_unknown_command_exits_2():
    result = CliRunner().invoke(cli.main, ["frobnicate"])
    assert result.exit_code == 2


# The commands of the project's design (its command list) that `fencepost` implements today, with their subcommands:
# removing one (or dropping it from the help) must fail here.
IMPLEMENTED_COMMANDS = {
    "bench": [],
    "bookie": ["start", "list", "decommission"],
    "broker": ["start"],
    "chaos": [],
    "cluster": ["init", "shutdown"],
    "dev": ["up", "down", "status", "restart", "add-broker"],
    "export": [],
    "audit": [],
    "dashboard": [],
    "snapshot": ["list", "create", "verify", "restore"],
    "status": [],
    "store": ["verify", "inspect", "mark-clean"],
    "submit": [],
    "task": ["show", "list", "cancel", "retry"],
    "queue": ["list", "declare", "show", "purge", "requeue-dead"],
    "worker": ["run", "list"],
    "zk": ["start", "stop"],
}


def _listed_commands(help_text: str) -> set[str]:
    """The names in the "Commands:" section of a click help text."""
    section = help_text.split("Commands:", 1)[1]
    return {line.split()[0] for line in section.splitlines() if line.startswith("  ") and line.split()}


def test_help_explains_every_top_level_command():
    result = CliRunner().invoke(cli.main, ["--help"])
    assert result.exit_code == 0
    assert set(IMPLEMENTED_COMMANDS) <= _listed_commands(result.output)


def test_every_command_group_lists_its_subcommands():
    for group, subcommands in IMPLEMENTED_COMMANDS.items():
        if not subcommands:
            continue
        result = CliRunner().invoke(cli.main, [group, "--help"])
        assert result.exit_code == 0, group
        assert set(subcommands) <= _listed_commands(result.output), group


def test_status_without_any_cluster_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.delenv("FENCEPOST_ZK", raising=False)
    result = CliRunner().invoke(cli.main, ["status", "--dev-dir", str(tmp_path / "none")])
    assert result.exit_code == 2
    assert "no dev cluster" in result.output


def test_invalid_cluster_name_fails_with_one_line(tmp_path):
    result = CliRunner().invoke(cli.main, ["dev", "up", "--dev-dir", str(tmp_path), "--cluster", "bad/name"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fencepost: invalid cluster name 'bad/name'"), (
        result.output
    )
    assert "Traceback" not in result.output
    assert not (tmp_path / "cluster.json").exists()


def test_dashboard_with_a_bad_listen_is_a_usage_error():
    result = CliRunner().invoke(cli.main, ["dashboard", "--listen", "nowhere", "--zk", "127.0.0.1:1"])
    assert result.exit_code == 2
    assert "--listen" in result.output and "HOST:PORT" in result.output


@pytest.mark.timeout(30)
def test_bench_help_names_every_benchmark():
    from commands.bench import BENCHMARKS

    result = CliRunner().invoke(cli.main, ["bench", "--help"])
    assert result.exit_code == 0
    listed = " ".join(result.output.split("(", 1)[1].split(")", 1)[0].split())  # the help's own list
    assert sorted(listed.split(", ")) == sorted(BENCHMARKS), result.output
