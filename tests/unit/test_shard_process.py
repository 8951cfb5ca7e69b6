"""The process of a shard n > 0: it dies with its broker, names its shard in its logs, takes its broker's id."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from broker import BrokerError
from broker.server.shard_command import CODE_ROOT
from broker.server.shard_process import name_logs_by_shard, wait_for_identity
from devtools.procs import pid_alive
from election.identity import META, IdentityError, read_identity
from election.local.clock import SYSTEM_CLOCK
from tests.support.clock import FakeClock

# A broker stand-in: starts a shard process that ties itself to it, says both pids, then sleeps.
_PARENT = """
import subprocess, sys, time, os
child = subprocess.Popen(
    [sys.executable, "-c", "from broker.server.shard_process import die_with_parent; import sys, time;"
     " die_with_parent(); print('tied', flush=True); time.sleep(60)"],
    env={**os.environ, "FENCEPOST_SHARD_PARENT_PID": str(os.getpid())},
    stdout=sys.stdout, process_group=0,
)
print(child.pid, flush=True)
time.sleep(60)
"""


def _meta(data: Path, cluster: str = "dev", broker_id: int = 7) -> None:
    data.mkdir(parents=True, exist_ok=True)
    doc = {"cluster": cluster, "name": "b1", "broker_id": broker_id, "register_code": "c0de"}
    (data / META).write_text(json.dumps(doc))


def test_a_shard_process_dies_when_its_broker_is_killed():
    env = {**os.environ, "PYTHONPATH": str(CODE_ROOT)}
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        child_pid = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "tied"
        assert pid_alive(child_pid)
        parent.kill()
        parent.wait(5)
        deadline = time.monotonic() + 5.0
        while pid_alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not pid_alive(child_pid), "the shard process outlived its broker"
    finally:
        parent.kill()
        parent.wait(5)


def test_a_shard_process_whose_broker_is_gone_already_does_not_start():
    code = "import sys; from broker.server.shard_process import enter_shard_process; sys.exit(enter_shard_process(1))"
    env = {**os.environ, "PYTHONPATH": str(CODE_ROOT), "FENCEPOST_SHARD_PARENT_PID": "1"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert (
        result.returncode == 0
        and "the broker (pid 1) that started this shard's process is gone" in result.stderr
    )


def test_every_log_line_names_the_shard(caplog):
    factory = logging.getLogRecordFactory()
    try:
        name_logs_by_shard(3)
        with caplog.at_level(logging.INFO):
            logging.getLogger("broker.server.node").info("became leader")
        assert caplog.records[-1].name == "broker.server.node[shard 3]"
    finally:
        logging.setLogRecordFactory(factory)


def test_the_id_comes_from_the_brokers_data_dir(tmp_path):
    _meta(tmp_path / "b1", broker_id=7)
    identity = wait_for_identity(tmp_path / "b1" / "shards" / "2", 2, "dev", threading.Event(), FakeClock())
    assert (identity.broker_id, identity.name) == (7, "b1")
    assert not (tmp_path / "b1" / "shards" / "2" / META).exists()  # nothing written: never registered
    with pytest.raises(IdentityError, match="belongs to cluster 'dev'"):
        read_identity(tmp_path / "b1", "other")


def test_the_id_is_waited_for_until_the_broker_establishes_it(tmp_path):
    threading.Timer(0.3, _meta, args=(tmp_path / "b1",)).start()
    started = time.monotonic()
    identity = wait_for_identity(tmp_path / "b1" / "shards" / "1", 1, "dev", threading.Event(), SYSTEM_CLOCK)
    assert identity.broker_id == 7 and time.monotonic() - started >= 0.25


def test_a_stop_ends_the_wait_for_the_id(tmp_path):
    stop = threading.Event()
    stop.set()
    with pytest.raises(BrokerError, match="stopped while waiting for the broker id"):
        wait_for_identity(tmp_path / "b1" / "shards" / "1", 1, "dev", stop, FakeClock())
