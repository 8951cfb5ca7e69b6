"""The shard processes a dev cluster's broker runs, as `dev status` shows them.

In a cluster of several shards each broker runs one process per shard n > 0
(broker/server/shard_children.py): ``broker start --shard n --data <data>/shards/<n> --listen ...``
with a port it picked. `dev status` finds them as the broker's child processes and reads
what they serve from their command lines, so it needs neither ZooKeeper nor the process's
cooperation (a child being restarted after a crash is simply absent for a moment).

Example::

    shard_processes(broker_pid)
    # [{"shard": 1, "pid": 4242, "address": "tcp://127.0.0.1:40123", "metrics": "127.0.0.1:40177",
    #   "data_dir": "/dev/broker-0/shards/1", "alive": True}, ...]
"""

from __future__ import annotations

from pathlib import Path

from devtools.procs import pid_alive

PROC = Path("/proc")


def option_value(argv: list[str], option: str) -> str | None:
    """The value following ``option`` on a command line, None if it is not there (pure)."""
    try:
        return argv[argv.index(option) + 1]
    except (ValueError, IndexError):
        return None


def shard_row(pid: int, argv: list[str]) -> dict | None:
    """What a shard process's command line says of it; None for a process that is not one (pure)."""
    shard = option_value(argv, "--shard")
    if "broker" not in argv or shard is None or not shard.isdigit():
        return None
    row = {
        "shard": int(shard),
        "pid": pid,
        "address": option_value(argv, "--listen"),
        "data_dir": option_value(argv, "--data"),
    }
    metrics = option_value(argv, "--metrics-listen")
    if metrics:
        row["metrics"] = metrics
    return row


def _children(pid: int) -> list[int]:
    children = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            children.append(int(entry.name))
    return children


def _argv(pid: int) -> list[str]:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def shard_processes(broker_pid: int) -> list[dict]:
    """The shard processes the broker ``broker_pid`` runs now, by shard (none for a 1-shard cluster)."""
    rows = []
    for pid in _children(broker_pid):
        row = shard_row(pid, _argv(pid))
        if row is not None:
            rows.append(dict(row, alive=pid_alive(pid)))
    return sorted(rows, key=lambda r: r["shard"])
