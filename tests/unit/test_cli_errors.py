"""Every error of the command line is one line on stderr: exit 2 for usage errors, 1 for failures.

Run in process with click's CliRunner: none of these cases reaches a server.
"""

import pytest
from click.testing import CliRunner

import cli
import commands.task

pytestmark = pytest.mark.timeout(30)

TARGET = ["--zk", "127.0.0.1:1", "--cluster", "c"]


@pytest.mark.parametrize(
    "args, env, code, words",
    [
        (["submit", "q", "x", "--delay", "-5", *TARGET], {}, 2, "'--delay'"),
        (["submit", "q", "x", "--priority", str(1 << 31), *TARGET], {}, 2, "'--priority'"),
        (["submit", "q", "x", "--wait", "0", *TARGET], {}, 2, "'--wait'"),
        (["submit", "bad/q", "x", *TARGET], {}, 2, "invalid queue name 'bad/q'"),
        (["worker", "run", "--queue", "bad/q", *TARGET, "--", "cat"], {}, 2, "invalid queue name 'bad/q'"),
        (["status", "--zk", "notahost:abc", "--cluster", "c"], {}, 2, "port 'abc'"),
        (["status"], {"FENCEPOST_ZK": "zk:0", "FENCEPOST_CLUSTER": "c"}, 2, "FENCEPOST_ZK"),
        (["submit", "q", "x", "--zk", "zk.invalid:2181", "--cluster", "c"], {}, 1, "cannot resolve"),
        (["status", "--zk", "zk.invalid:2181", "--cluster", "c"], {}, 1, "cannot resolve"),
        (["frobnicate"], {}, 2, "No such command"),
        (["--no-such-flag"], {}, 2, "No such option"),
    ],
)
def test_one_line_and_exit_code(args, env, code, words):
    result = CliRunner().invoke(cli.main, args, env=env)
    assert result.exit_code == code, result.output
    assert result.output.count("\n") == 1 and result.output.startswith("fencepost: "), result.output
    assert words in result.output and "Traceback" not in result.output


def test_a_bug_is_one_line_too(monkeypatch):
    def broken(*_args, **_kwargs):
        raise KeyError("oops")

    monkeypatch.setattr(commands.task, "make_client", broken)
    result = CliRunner().invoke(cli.main, ["task", "show", "t1", *TARGET])
    assert result.exit_code == 1
    assert result.output == "fencepost: internal error: KeyError: 'oops' (--log-level debug shows where)\n"
