"""What each member of a dev cluster is doing: serving, waiting (and for what), or down.

A bookie or broker may run without listening yet because it waits for something the
cluster must do first: `cluster init`, the other members of a cluster that has no log
(``--wait-for``), the brokers that restore a cluster id its cookie names, a snapshot that
covers the log start. Each says so in its log, in a line that says "waiting"; the last
such line since the member was started is what it waits for. :func:`wait_started` lets
`dev up` start every member and return once each either listens or waits for something
named (a member that exits, or stays silent without saying why, is an error);
:func:`member_rows` is `dev status`.

Example::

    waits = wait_started(members, timeout=30.0)    # {"bookie-0": "... waiting", ...}
    report_started(members, progress=print)         # the same, one line per member
    member_rows(run_dir, state)                     # [{"name": "broker-0", "state": "waiting", ...}]
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from devtools.dev_members import member_name, port_taken, read_broker_id
from devtools.dev_shards import shard_processes
from devtools.dev_spec import DevClusterError
from devtools.procs import owns, pid_alive
from devtools.zk_ensemble import server_mode
from devtools.zkserver import four_letter

UP, WAITING, DOWN = "up", "waiting", "DOWN"
# How long every member that does not listen must go on saying the same wait before `dev up` returns.
SETTLE_S = 3.0
# At most this much of a member's log (its end) is read for its wait.
TAIL_BYTES = 64 * 1024


def log_message(line: str) -> str:
    """The message of one log line (text: after ``LEVEL logger:``; ``--log-json``: its ``msg``)."""
    line = line.strip()
    if line.startswith("{"):
        try:
            return str(json.loads(line).get("msg", line))
        except ValueError:
            return line
    head, sep, message = line.partition(": ")
    return message if sep and len(head.split()) >= 3 else line


def waiting_reason(log_text: str) -> str | None:
    """What the last line of ``log_text`` that says "waiting" says, or None."""
    for line in reversed(log_text.splitlines()):
        if "waiting" in line.lower():
            return log_message(line)
    return None


def _log_since_start(member: dict) -> str:
    """The member's log since its last start (``log_offset``, recorded when it was spawned)."""
    try:
        with open(member["log"], "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(int(member.get("log_offset", 0)), size - TAIL_BYTES))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def member_state(member: dict, run_dir: Path) -> tuple[str, str | None]:
    """``(UP | WAITING | DOWN, what it waits for)`` of a recorded bookie or broker."""
    if not (pid_alive(member["pid"]) and owns(member["pid"], str(run_dir))):
        return DOWN, None
    if port_taken(member["address"]):
        return UP, None
    return WAITING, waiting_reason(_log_since_start(member)) or "not listening yet"


def wait_started(members: list[dict], timeout: float = 30.0, settle_s: float = SETTLE_S) -> dict[str, str]:
    """Return once every member listens, or each that does not has said the same wait for
    ``settle_s``; ``{name: what it waits for}`` of those. DevClusterError if one exits, or if one
    neither listens nor says what it waits for within ``timeout``."""
    deadline = time.monotonic() + timeout
    waits: dict[str, str] = {}
    steady_since = time.monotonic()
    while True:
        now_waiting = {}
        for member in members:
            if not pid_alive(member["pid"]):
                lines = _log_since_start(member).strip().splitlines()
                raise DevClusterError(
                    f"{member_name(member)} exited during start (log {member['log']}): "
                    f"{lines[-1] if lines else 'no output'}"
                )
            if not port_taken(member["address"]):
                now_waiting[member_name(member)] = waiting_reason(_log_since_start(member))
        if not now_waiting:
            return {}
        if now_waiting != waits:
            waits, steady_since = now_waiting, time.monotonic()
        if all(waits.values()) and time.monotonic() - steady_since >= settle_s:
            return dict(waits)
        if time.monotonic() > deadline:
            silent = next(m for m in members if member_name(m) in waits and not waits[member_name(m)])
            raise DevClusterError(
                f"{member_name(silent)} did not listen on {silent['address']} in {timeout:g}s "
                f"and does not say what it waits for (log {silent['log']})"
            )
        time.sleep(0.1)


def report_started(members: list[dict], progress: Callable[[str], None], restarted: bool = False) -> None:
    """Wait for ``members`` just started (:func:`wait_started`); one line each: where it listens,
    or what it waits for."""
    waits = wait_started(members)
    for member in members:
        name = member_name(member)
        line = (
            f"{name} restarted on {member['address']} (data {member['data_dir']})"
            if restarted
            else f"{name} listening on {member['address']}"
        )
        progress(f"{name} started on {member['address']}; waiting: {waits[name]}" if name in waits else line)


def member_rows(run_dir: Path, state: dict | None) -> list[dict]:
    """One row per recorded process: name, kind, pid, address, data_dir, host, alive, state (and
    ``waiting``: what a member that does not listen waits for); a ZooKeeper server's mode; a broker's
    id and, in a sharded cluster, its shard processes (``shards``)."""
    if not state:
        return []
    rows = []
    for member in state["processes"]:
        row = {
            "name": member_name(member),
            **{k: member.get(k) for k in ("kind", "pid", "address", "data_dir")},
            "host": member.get("host", "local"),
        }
        if member["kind"] == "zookeeper":
            alive = pid_alive(member["pid"]) and owns(member["pid"], str(run_dir))
            if alive:
                host, port = member["address"].rsplit(":", 1)
                alive = four_letter(host, int(port)) == "imok"
            row["alive"], row["state"] = alive, UP if alive else DOWN
            # leader or follower in an ensemble, standalone otherwise; None when it does not serve.
            row["mode"] = server_mode(member["address"]) if alive else None
        else:
            row["state"], waiting = member_state(member, run_dir)
            row["alive"] = row["state"] != DOWN
            if waiting is not None:
                row["waiting"] = waiting
        if member.get("metrics"):
            row["metrics"] = member["metrics"]
        if member["kind"] == "broker":
            row["broker_id"] = read_broker_id(Path(member["data_dir"]))
            shards = shard_processes(member["pid"]) if row["alive"] else []
            if shards:
                row["shards"] = shards
        rows.append(row)
    return rows
