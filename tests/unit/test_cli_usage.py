"""Usage errors exit 2 with usage text; package errors exit 1 with one line."""
from click.testing import CliRunner

import cli


def test_bad_flag_exits_2_with_usage():
    result = CliRunner().invoke(cli.main, ["dev", "up", "--no-such-flag"])
    assert result.exit_code == 2
    assert "Usage:" in result.output and "No such option" in result.output


def test_unknown_command_exits_2():
    result = CliRunner().invoke(cli.main, ["frobnicate"])
    assert result.exit_code == 2


def test_help_explains_every_top_level_command():
    result = CliRunner().invoke(cli.main, ["--help"])
    assert result.exit_code == 0
    for name in ("zk", "dev", "bookie", "status"):
        assert name in result.output


def test_status_without_any_cluster_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.delenv("FENCEPOST_ZK", raising=False)
    result = CliRunner().invoke(cli.main, ["status", "--dev-dir", str(tmp_path / "none")])
    assert result.exit_code == 2
    assert "no dev cluster" in result.output


def test_invalid_cluster_name_fails_with_one_line(tmp_path):
    result = CliRunner().invoke(cli.main, ["dev", "up", "--dev-dir", str(tmp_path), "--cluster", "bad/name"])
    assert result.exit_code == 1
