"""The process of one shard, as its parent broker starts it: data dir, addresses, command line, environment.

In a cluster of S > 1 shards (election/shards.py) the broker an operator starts serves shard 0
and runs one process for each shard n in 1..S-1 (:mod:`broker.server.shard_children`)::

    python -m cli [--log-level L] [--log-json] broker start --shard n --data <data>/shards/<n>
        --listen tcp://<host>:<free port> [--metrics-listen <host>:<free port>]
        --shutdown-timeout-s <a share of the parent's> <every other setting that differs from its default>

So the child has every setting of its parent but its own data dir, addresses and shard. Its
environment is the parent's, except that it names no TOML file (``FENCEPOST_CONFIG`` is the
null device: the settings the parent read from its file are on the command line), the
parent's pid (the child dies with it, :mod:`broker.server.shard_process`), and, with
``FENCEPOST_ZK_SESSION_FILE`` set, the child's own session file ``<that file>.shard<n>``.

A child stops within a share of the parent's ``shutdown_timeout_s``: the parent signals its
children when its own stop begins and waits for them before its own budget runs out.

:class:`RestartBackoff` spaces the restarts of a child that keeps dying.

Example::

    command = child_command(config, 2, listen="tcp://10.0.0.5:40123", metrics_listen="", log_level="info")
    env = child_env(os.environ, 2, parent_pid=os.getpid())
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import typing
from pathlib import Path
from typing import Mapping

from broker import BrokerError
from broker.server.config import BrokerConfig

SHARDS_DIR = "shards"
PARENT_PID_ENV = "FENCEPOST_SHARD_PARENT_PID"
SESSION_FILE_ENV = "FENCEPOST_ZK_SESSION_FILE"
CONFIG_FILE_ENV = "FENCEPOST_CONFIG"
# A child must be gone before its parent's own budget ends: it gets this share of it.
CHILD_STOP_SHARE = 0.8
# The top-level directory holding the packages and `cli` (in the repository or site-packages).
CODE_ROOT = Path(__file__).resolve().parents[2]


def shard_data_dir(data: str | Path, shard: int) -> Path:
    """Where the process of ``shard`` keeps its store, snapshots and lock: ``<data>/shards/<shard>``."""
    return Path(data) / SHARDS_DIR / str(shard)


def parent_data_dir(data: str | Path, shard: int) -> Path:
    """The data dir of the broker that started the process of ``shard`` (which holds the broker id)."""
    path = Path(data)
    if path.name != str(shard) or path.parent.name != SHARDS_DIR:
        raise BrokerError(
            f"the data dir of shard {shard} must be <broker data>/{SHARDS_DIR}/{shard}, not {path}"
        )
    return path.parent.parent


def free_address(address: str) -> str:
    """``address`` (``tcp://host:port`` or ``host:port``) with a port free on that host now."""
    prefix = "tcp://" if address.startswith("tcp://") else ""
    host = address.removeprefix(prefix).rsplit(":", 1)[0]
    family, kind, proto, _name, where = socket.getaddrinfo(host.strip("[]"), 0, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as sock:
        sock.bind(where)
        port = sock.getsockname()[1]
    return f"{prefix}{host}:{port}"


def _option(name: str) -> str:
    # The naming rule of the generated `broker start` options (commands/options.py).
    return "--" + name.replace("_", "-")


def settings_args(config: BrokerConfig, first: tuple[str, ...] = ()) -> list[str]:
    """The `broker start` options that give a process ``config``'s settings: those of ``first``
    (when set) in that order, then every other setting that differs from its default."""
    hints = typing.get_type_hints(BrokerConfig)
    fields = {field.name: field for field in dataclasses.fields(BrokerConfig)}
    head = [[_option(name), str(getattr(config, name))] for name in first if getattr(config, name) != ""]
    rest: list[list[str]] = []
    for name, field in fields.items():
        value = getattr(config, name)
        if name in first or value == field.default:
            continue
        if hints[name] is bool:
            # A flag only says the value that is not the default.
            rest.append([_option(("no_" if field.default else "") + name)])
        else:
            rest.append([_option(name), str(value)])
    return [arg for option in head + rest for arg in option]


def child_config(config: BrokerConfig, shard: int, listen: str, metrics_listen: str) -> BrokerConfig:
    """The settings of the process of ``shard`` started by the broker of ``config``."""
    return dataclasses.replace(
        config,
        shard=shard,
        data=str(shard_data_dir(config.data, shard)),
        listen=listen,
        metrics_listen=metrics_listen,
        shutdown_timeout_s=max(1.0, round(config.shutdown_timeout_s * CHILD_STOP_SHARE, 3)),
    )


def child_command(
    config: BrokerConfig,
    shard: int,
    listen: str,
    metrics_listen: str,
    log_level: str = "info",
    log_json: bool = False,
) -> list[str]:
    """The command line of the process of ``shard`` (see the module docstring)."""
    child = child_config(config, shard, listen, metrics_listen)
    # zk and cluster always: left out, `broker start` would look for them in a dev cluster's record.
    options = settings_args(child, first=("shard", "data", "listen", "metrics_listen", "zk", "cluster"))
    logging_options = ["--log-level", log_level, *(["--log-json"] if log_json else [])]
    return [sys.executable, "-m", "cli", *logging_options, "broker", "start", *options]


def child_env(environ: Mapping[str, str], shard: int, parent_pid: int) -> dict[str, str]:
    """The environment of the process of ``shard`` (see the module docstring)."""
    env = dict(environ)
    env[PARENT_PID_ENV] = str(parent_pid)
    env[CONFIG_FILE_ENV] = os.devnull
    if environ.get(SESSION_FILE_ENV):
        env[SESSION_FILE_ENV] = f"{environ[SESSION_FILE_ENV]}.shard{shard}"
    paths = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(CODE_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join([str(CODE_ROOT), *paths])
    return env


class RestartBackoff:
    """How long to wait before starting a child that died: doubling from ``first_s`` up to ``max_s``,
    and ``first_s`` again once a child had run ``stable_s`` before dying."""

    def __init__(self, first_s: float = 1.0, max_s: float = 60.0, stable_s: float = 60.0) -> None:
        self.first_s, self.max_s, self.stable_s = first_s, max_s, stable_s
        self._next = first_s

    def delay(self, ran_s: float) -> float:
        """The wait before the next start of a child that ran ``ran_s`` seconds."""
        if ran_s >= self.stable_s:
            self._next = self.first_s
        delay, self._next = self._next, min(self.max_s, self._next * 2)
        return delay
