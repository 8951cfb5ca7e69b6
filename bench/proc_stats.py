"""CPU time and context switches of named groups of processes over a measured window, from /proc.

A benchmark names its processes by kind (``leader``, ``followers``, ``bookies``,
``zookeeper``, ``client``; ``rabbitmq`` for a RabbitMQ node's processes), samples
them when its window opens and when it closes, and divides the differences by the
tasks handled in between:

* ``cpu_us_per_task``: per kind, user + system CPU (``utime + stime`` of
  ``/proc/<pid>/stat``, every thread of the process) in microseconds per task, and
  ``total`` over the kinds;
* ``leader_ctx_switches_per_task``: ``voluntary`` and ``involuntary`` context
  switches of the ``leader`` process per task. ``/proc/<pid>/status`` counts the
  main thread only, so these are summed over ``/proc/<pid>/task/*/status`` (a
  thread that ends inside the window takes its switches with it).

The parsers are pure (``tests/unit/test_bench_proc_stats.py``); the readers return
None for a process that is gone. :class:`Window` adds a system's own counters
(:class:`bench.commit_counts.LedgerCounters` for fencepost) to the same window.

Example::

    watch = ProcWatch({"leader": [leader_pid], "bookies": bookie_pids, "client": [os.getpid()]})
    window = Window(watch)
    window.begin()
    ...                                   # the load runs
    window.end()
    window.per_task(tasks=1200)   # {"cpu_us_per_task": {"leader": 412.5, ...}, "leader_ctx_switches_per_task": ...}
"""

from __future__ import annotations

import os
from typing import Any, Protocol


def _ticks_per_s() -> int:
    return os.sysconf("SC_CLK_TCK")


def parse_stat(text: str) -> tuple[int, int]:
    """``(session id, utime + stime in clock ticks)`` from the text of ``/proc/<pid>/stat``.

    The command name (in parentheses) may hold spaces and parentheses, so the
    fields are counted from the last ``)``.

    >>> parse_stat("42 (beam.smp) S 1 42 42 0 -1 4194560 1 0 0 0 150 30 0 0 20 0 30 0 1 1 1")
    (42, 180)
    """
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[3]), int(fields[11]) + int(fields[12])


def parse_ctx_switches(text: str) -> tuple[int, int]:
    """``(voluntary, involuntary)`` context switches from the text of a ``status`` file (0 if absent)."""
    counts = {"voluntary_ctxt_switches": 0, "nonvoluntary_ctxt_switches": 0}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in counts:
            counts[name] = int(value)
    return counts["voluntary_ctxt_switches"], counts["nonvoluntary_ctxt_switches"]


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds used so far by process ``pid`` (all its threads), or None if gone."""
    text = _read(f"/proc/{pid}/stat")
    return None if text is None else parse_stat(text)[1] / _ticks_per_s()


def ctx_switches(pid: int) -> tuple[int, int] | None:
    """``(voluntary, involuntary)`` context switches of every live thread of ``pid``, or None if gone."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    voluntary = involuntary = 0
    for tid in threads:
        text = _read(f"/proc/{pid}/task/{tid}/status")
        if text is not None:  # a thread may end while we list
            v, i = parse_ctx_switches(text)
            voluntary, involuntary = voluntary + v, involuntary + i
    return voluntary, involuntary


def machine_busy_s() -> float | None:
    """CPU seconds (all cores) the machine spent busy so far: /proc/stat minus idle and iowait."""
    text = _read("/proc/stat")
    try:
        fields = [int(x) for x in (text or "").splitlines()[0].split()[1:]]
    except (IndexError, ValueError):
        return None
    return (sum(fields[:8]) - fields[3] - fields[4]) / _ticks_per_s()


def session_pids(session: int) -> list[int]:
    """Every process whose session id is ``session`` (a child started with ``start_new_session``)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            text = _read(f"/proc/{name}/stat")
            if text is not None and parse_stat(text)[0] == session:
                out.append(int(name))
    return sorted(out)


def per_task(amount: float | None, tasks: int, digits: int = 1) -> float | None:
    """``amount / tasks`` rounded, or None when either is missing or no task was handled.

    >>> per_task(3.0, 2)
    1.5
    """
    if amount is None or tasks <= 0:
        return None
    return round(amount / tasks, digits)


class ProcWatch:
    """Named groups of processes whose CPU (and the leader's context switches) a window measures."""

    def __init__(self, kinds: dict[str, list[int]], leader: int | None = None) -> None:
        self.kinds = {kind: list(pids) for kind, pids in kinds.items() if pids}
        self.leader = leader if leader is not None else (self.kinds.get("leader") or [None])[0]

    def sample(self) -> dict[str, Any]:
        """``{"cpu": {kind: seconds or None}, "ctx": (voluntary, involuntary) or None}`` now."""
        cpu: dict[str, float | None] = {}
        for kind, pids in self.kinds.items():
            readings = [cpu_s(pid) for pid in pids]
            # A process gone from a group makes that group's figure meaningless, not smaller.
            cpu[kind] = None if None in readings else sum(readings)
        return {"cpu": cpu, "ctx": ctx_switches(self.leader) if self.leader is not None else None}

    @staticmethod
    def per_task(before: dict, after: dict, tasks: int) -> dict:
        """The window's CPU per task by kind (and total) and the leader's context switches per task."""
        cpu: dict[str, float | None] = {}
        for kind, start in before["cpu"].items():
            end = after["cpu"].get(kind)
            cpu[kind] = (
                per_task((end - start) * 1e6, tasks) if start is not None and end is not None else None
            )
        known = [v for v in cpu.values() if v is not None]
        cpu["total"] = round(sum(known), 1) if known and len(known) == len(before["cpu"]) else None
        ctx = None
        if before["ctx"] is not None and after["ctx"] is not None:
            ctx = {
                "voluntary": per_task(after["ctx"][0] - before["ctx"][0], tasks, 2),
                "involuntary": per_task(after["ctx"][1] - before["ctx"][1], tasks, 2),
            }
        return {"cpu_us_per_task": cpu, "leader_ctx_switches_per_task": ctx}


class Counters(Protocol):
    """A system's own counters over the window (e.g. ledger entries and group commits)."""

    def sample(self) -> Any: ...

    def per_task(self, before: Any, after: Any, tasks: int) -> dict: ...


class Window:
    """One measured window: /proc readings and, when given, a system's counters, at its two ends."""

    def __init__(self, watch: ProcWatch, counters: Counters | None = None) -> None:
        self.watch, self.counters = watch, counters
        self._procs: list[dict] = []
        self._counts: list[Any] = []

    def begin(self) -> None:
        self._procs = [self.watch.sample()]
        self._counts = [self.counters.sample()] if self.counters is not None else []

    def end(self) -> None:
        # The same order at both ends, so each reading covers an equally long stretch of the load.
        self._procs.append(self.watch.sample())
        if self.counters is not None:
            self._counts.append(self.counters.sample())

    def per_task(self, tasks: int) -> dict:
        """Everything measured, per task handled in the window (call after :meth:`end`)."""
        out = self.watch.per_task(self._procs[0], self._procs[1], tasks)
        if self.counters is not None:
            out.update(self.counters.per_task(self._counts[0], self._counts[1], tasks))
        return out
