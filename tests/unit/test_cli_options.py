"""`broker start` and `bookie start` options are generated from the config dataclasses."""

import dataclasses
import typing

import click
import pytest
from click.testing import CliRunner

import cli
from broker.server.config import BrokerConfig
from commands.bookie import bookie_start
from commands.broker import broker_start
from commands.options import config_options, option_name, settings_flags
from ledger.bookie.config import BookieConfig

# Options of these commands that are not settings of the process.
NOT_SETTINGS = {"--config", "--dev-dir", "--zk-auth", "--help"}
COMMANDS = [(broker_start, BrokerConfig), (bookie_start, BookieConfig)]


def _option_names(command: click.Command, hidden: bool = False) -> list[str]:
    return [
        opt
        for param in command.params
        if isinstance(param, click.Option) and param.hidden == hidden
        for opt in param.opts
    ]


@pytest.mark.parametrize("command, cls", COMMANDS, ids=["broker", "bookie"])
def test_every_field_has_exactly_one_option_and_every_option_a_field(command, cls):
    names = _option_names(command)
    assert len(names) == len(set(names)), names
    hints = typing.get_type_hints(cls)
    hidden = {option_name(f, hints[f.name]) for f in dataclasses.fields(cls) if f.metadata.get("hidden")}
    wanted = {option_name(f, hints[f.name]) for f in dataclasses.fields(cls)} - hidden
    assert len(wanted) + len(hidden) == len(dataclasses.fields(cls))
    assert set(names) - NOT_SETTINGS == wanted
    # The hidden ones are the old spellings of renamed fields, one each, and the fields not for
    # operators (a broker's --shard, for the processes it starts).
    assert sorted(_option_names(command, hidden=True)) == sorted(
        ["--" + old.replace("_", "-") for old in cls.former_names] + list(hidden)
    )


@pytest.mark.parametrize("command, cls", COMMANDS, ids=["broker", "bookie"])
def test_every_field_has_help_and_the_help_names_its_env_variable(command, cls):
    helps = {param.opts[0]: param.help for param in command.params if isinstance(param, click.Option)}
    for f in dataclasses.fields(cls):
        assert f.metadata.get("help"), f.name
        if f.name in ("zk", "cluster"):
            continue  # cluster_options declares these two, with the dev-cluster fallback
        flag = next(o for o in helps if o.lstrip("-").removeprefix("no-").replace("-", "_") == f.name)
        assert f"FENCEPOST_{f.name.upper()}" in helps[flag]


def test_options_keep_their_names_types_and_shown_defaults():
    result = CliRunner().invoke(cli.main, ["broker", "start", "--help"])
    assert result.exit_code == 0
    for text in (
        "--no-fsync",
        "--learner",
        "--zk-session-timeout-s FLOAT",
        "--checkpoint-entries INTEGER RANGE",
        "default 256 MiB",
        "--data DIRECTORY",
        "--secret-file FILE",
        "--shutdown-timeout-s FLOAT",
    ):
        assert text in result.output, text
    result = CliRunner().invoke(cli.main, ["broker", "start", "--snapshots-kept", "0"])
    assert result.exit_code == 2 and "--snapshots-kept" in result.output


def _captured(cls, args):
    """The flags a generated command hands to load_settings for ``args``."""
    seen = {}

    @click.command()
    @config_options(cls)
    def command(**settings):
        seen.update(settings_flags(cls, settings))

    result = CliRunner().invoke(command, args)
    assert result.exit_code == 0, result.output
    return seen


def test_absent_options_leave_env_and_toml_in_charge():
    flags = _captured(BrokerConfig, [])
    assert set(flags) == {f.name for f in dataclasses.fields(BrokerConfig)}
    assert all(value is None for value in flags.values())


def test_given_options_become_typed_flags():
    flags = _captured(
        BrokerConfig,
        ["--no-fsync", "--learner", "--tick-ms", "7", "--checkpoint-s", "1.5", "--name", "b9"],
    )
    assert (
        flags["fsync"],
        flags["learner"],
        flags["tick_ms"],
        flags["checkpoint_s"],
        flags["name"],
    ) == (False, True, 7, 1.5, "b9")
    assert (
        _captured(BookieConfig, ["--bookie-id", "bk-1", "--map-size-bytes", "2097152"])["bookie_id"] == "bk-1"
    )


def test_a_field_without_help_is_refused():
    @dataclasses.dataclass
    class Bare:
        port: int = 1

    with pytest.raises(TypeError, match="Bare.port has no help"):
        config_options(Bare)


@pytest.mark.parametrize(
    "cls, old, new, value",
    [
        (BrokerConfig, "--zk-session-timeout", "zk_session_timeout_s", 3.0),
        (BrokerConfig, "--shutdown-timeout", "shutdown_timeout_s", 7.0),
        (BrokerConfig, "--checkpoint-seconds", "checkpoint_s", 1.5),
        (BrokerConfig, "--retention-seconds", "retention_s", 0.0),
        (BrokerConfig, "--max-time-not-caught-up", "max_time_not_caught_up_s", 2.0),
        (BrokerConfig, "--map-size", "map_size_bytes", 1 << 21),
        (BookieConfig, "--map-size", "map_size_bytes", 1 << 21),
    ],
)
def test_an_old_flag_still_sets_its_renamed_field_with_a_warning(cls, old, new, value, tmp_path, caplog):
    from election.local.settings import load_settings

    flags = _captured(cls, [old, str(value)])
    caplog.set_level("WARNING", logger="election.local.settings")
    section = "broker" if cls is BrokerConfig else "bookie"
    config = load_settings(cls, section, flags=flags, env={}, toml_path=tmp_path / "absent.toml")
    assert getattr(config, new) == value
    assert f"{old} is deprecated: use --{new.replace('_', '-')}" in caplog.text


def test_old_flags_are_hidden_and_ranges_have_both_ends():
    result = CliRunner().invoke(cli.main, ["broker", "start", "--help"])
    assert result.exit_code == 0
    assert "--zk-session-timeout-s" in result.output
    assert "--zk-session-timeout " not in result.output and "--map-size " not in result.output
    for args in (["--zk-session-timeout-s", "601"], ["--zk-session-timeout", "0.1"], ["--checkpoint-s", "0"]):
        result = CliRunner().invoke(cli.main, ["broker", "start", *args])
        assert result.exit_code == 2 and args[0] in result.output, (args, result.output)
