"""A broker's processes for its other shards: their command line, environment, restarts and stop."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import cli
from broker import BrokerError
from broker.server.config import BrokerConfig
from broker.server.shard_children import ShardChildren, how_it_ended, start_shard_children
from broker.server.shard_command import (
    CODE_ROOT,
    RestartBackoff,
    child_command,
    child_config,
    child_env,
    free_address,
    parent_data_dir,
    shard_data_dir,
)
from tests.support.clock import FakeClock


def _parent(**changes) -> BrokerConfig:
    settings = {
        "data": "/srv/b1",
        "listen": "tcp://127.0.0.1:5601",
        "metrics_listen": "127.0.0.1:9100",
        "zk": "zk1:2181,zk2:2181",
        "cluster": "prod",
    }
    return BrokerConfig(**{**settings, **changes}).validate()


def test_a_shards_data_dir_is_under_its_brokers_and_leads_back_to_it():
    assert shard_data_dir("/srv/b1", 3) == Path("/srv/b1/shards/3")
    assert parent_data_dir("/srv/b1/shards/3", 3) == Path("/srv/b1")
    for wrong in ("/srv/b1/shards/2", "/srv/b1/3", "/srv/b1"):
        with pytest.raises(BrokerError, match="must be <broker data>/shards/3"):
            parent_data_dir(wrong, 3)


def test_the_child_command_gives_the_parents_settings_but_its_own_shard_dirs_and_addresses():
    parent = _parent(fsync=False, learner=True, wait_for=3, tick_ms=7, name="b1")
    command = child_command(parent, 2, "tcp://127.0.0.1:40001", "127.0.0.1:40002", "debug", log_json=True)
    assert command[:8] == [
        sys.executable,
        "-m",
        "cli",
        "--log-level",
        "debug",
        "--log-json",
        "broker",
        "start",
    ]
    options = command[8:]
    assert options[:12] == [
        "--shard",
        "2",
        "--data",
        "/srv/b1/shards/2",
        "--listen",
        "tcp://127.0.0.1:40001",
        "--metrics-listen",
        "127.0.0.1:40002",
        "--zk",
        "zk1:2181,zk2:2181",
        "--cluster",
        "prod",
    ]
    assert {"--no-fsync", "--learner"} <= set(options)
    assert options[options.index("--wait-for") + 1] == "3" and options[options.index("--tick-ms") + 1] == "7"
    # A child stops within a share of the parent's budget, so the parent sees it gone within its own.
    assert float(options[options.index("--shutdown-timeout-s") + 1]) == 8.0
    # Settings at their default are left out (the child's environment is the parent's).
    assert "--max-batch-events" not in options
    # Without metrics on the parent, none on the child.
    bare = child_command(_parent(metrics_listen=""), 1, "tcp://127.0.0.1:40003", "")
    assert "--metrics-listen" not in bare


def test_the_child_command_parses_back_into_the_childs_settings(monkeypatch):
    """Through the real `broker start`: what the child runs with is the parent's config, shard-made."""
    parent = _parent(
        fsync=False, learner=True, wait_for=2, checkpoint_s=12.5, secret_file="", allow_lagging_leader=False
    )
    command = child_command(parent, 5, "tcp://127.0.0.1:40011", "127.0.0.1:40012")
    seen = []

    class Node:
        def __init__(self, config):
            seen.append(config)

        def run(self):
            return 0

    monkeypatch.setattr("broker.server.node.BrokerNode", Node)
    env = {"FENCEPOST_CONFIG": os.devnull, "FENCEPOST_ZK": "", "FENCEPOST_CLUSTER": ""}
    result = CliRunner().invoke(cli.main, command[3:], env=env)
    assert result.exit_code == 0, result.output
    assert seen == [child_config(parent, 5, "tcp://127.0.0.1:40011", "127.0.0.1:40012")]
    assert dataclasses.replace(
        seen[0], shard=0, data=parent.data, listen=parent.listen
    ) == dataclasses.replace(parent, metrics_listen="127.0.0.1:40012", shutdown_timeout_s=8.0)


def test_the_child_env_names_its_parent_no_toml_and_its_own_session_file():
    env = child_env(
        {"PATH": "/bin", "FENCEPOST_ZK_SESSION_FILE": "/run/b1.zk-session", "PYTHONPATH": "/x"},
        shard=4,
        parent_pid=1234,
    )
    assert env["PATH"] == "/bin" and env["FENCEPOST_SHARD_PARENT_PID"] == "1234"
    assert env["FENCEPOST_CONFIG"] == os.devnull
    assert env["FENCEPOST_ZK_SESSION_FILE"] == "/run/b1.zk-session.shard4"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(CODE_ROOT), "/x"]
    assert "FENCEPOST_ZK_SESSION_FILE" not in child_env({}, shard=1, parent_pid=1)


def test_a_free_address_keeps_the_host_and_the_form():
    assert free_address("tcp://127.0.0.1:5601").startswith("tcp://127.0.0.1:")
    metrics = free_address("127.0.0.1:9100")
    assert metrics.startswith("127.0.0.1:") and int(metrics.rsplit(":", 1)[1]) > 0


def test_restarts_back_off_and_start_over_after_a_stable_run():
    backoff = RestartBackoff(first_s=1.0, max_s=60.0, stable_s=60.0)
    assert [backoff.delay(0.5) for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff.delay(61.0) == 1.0 and backoff.delay(3.0) == 2.0


def test_how_a_child_ended_reads_well():
    assert how_it_ended(-signal.SIGKILL) == "was killed by SIGKILL"
    assert how_it_ended(1) == "exited with code 1"


class FakeProc:
    pids = iter(range(5000, 6000))

    def __init__(self, command, **kwargs):
        self.command, self.kwargs = command, kwargs
        self.pid = next(self.pids)
        self.returncode = None
        self.signals = []

    def poll(self):
        return self.returncode

    def terminate(self):
        self.signals.append(signal.SIGTERM)
        self.returncode = 0

    def kill(self):
        self.signals.append(signal.SIGKILL)
        self.returncode = -signal.SIGKILL

    def wait(self, timeout=None):
        return self.returncode


def test_children_start_are_restarted_when_they_die_and_stop_with_the_broker():
    clock, stop = FakeClock(threaded=True), threading.Event()
    started: list[FakeProc] = []

    def popen(command, **kwargs):
        started.append(FakeProc(command, **kwargs))
        return started[-1]

    children = ShardChildren(_parent(), 3, stop, remaining=lambda cap: cap, clock=clock, popen=popen)
    children.start()
    clock.until_waiting(1)
    assert [p.command[p.command.index("--shard") + 1] for p in started] == ["1", "2"]
    assert all(p.kwargs["process_group"] == 0 and p.kwargs["stdin"] is subprocess.DEVNULL for p in started)
    assert started[0].kwargs["env"]["FENCEPOST_SHARD_PARENT_PID"] == str(os.getpid())
    first_listen = started[0].command[started[0].command.index("--listen") + 1]

    started[0].returncode = -signal.SIGKILL  # shard 1's process dies: started again after 1 s
    clock.advance(0.2)
    clock.until_waiting(1)
    assert len(started) == 2
    clock.advance(1.0)
    clock.until_waiting(1)
    assert len(started) == 3 and started[2].command[started[2].command.index("--shard") + 1] == "1"
    assert started[2].command[started[2].command.index("--listen") + 1] != first_listen  # a fresh port

    started[1].returncode = 0  # shard 2's process stopped in order: it stays stopped
    clock.advance(120.0)
    clock.until_waiting(1)
    assert len(started) == 3 and children.pids() == {1: started[2].pid}

    stop.set()
    children.close(timeout=5.0)
    assert started[2].signals == [signal.SIGTERM] and started[1].signals == []


def test_a_child_that_does_not_stop_in_time_is_killed():
    clock, stop = FakeClock(threaded=True), threading.Event()
    stubborn: list[FakeProc] = []

    class Stubborn(FakeProc):
        def terminate(self):
            self.signals.append(signal.SIGTERM)

    def popen(command, **kwargs):
        stubborn.append(Stubborn(command, **kwargs))
        return stubborn[-1]

    children = ShardChildren(
        _parent(), 2, stop, remaining=lambda cap: min(cap, 2.0), clock=clock, popen=popen
    )
    children.start()
    clock.until_waiting(1)
    stop.set()
    deadline = time.monotonic() + 10.0
    while stubborn[0].poll() is None and time.monotonic() < deadline:
        clock.advance(0.5)  # the stop's wait for the child runs on the fake clock
        time.sleep(0.01)
    children.close(timeout=5.0)
    assert [p.signals for p in stubborn] == [[signal.SIGTERM, signal.SIGKILL]]


def test_only_the_broker_of_shard_0_of_a_sharded_cluster_starts_children():
    stop = threading.Event()
    assert start_shard_children(_parent(), {"cluster_id": "c"}, stop, lambda cap: cap) is None
    assert start_shard_children(_parent(shard=1), {"shards": 3}, stop, lambda cap: cap) is None
