"""CPU seconds and peak memory of ``bench pipeline``'s phases: the driver, Spark's processes, the cluster.

The machine the benchmark runs on is often shared, so wall-clock seconds say little alone: a
phase's CPU seconds say how much work it did whatever else ran. :class:`PhaseCpu` samples, at
each phase's start and end, the user + system CPU (``/proc/<pid>/stat``) of

* ``driver``: this process (the pipeline's driver: planning, the in-driver replay, Arrow);
* ``spark``: Spark's JVM (the py4j gateway's process) and every process under it (its Python
  workers), found by walking ``/proc`` for descendants;
* ``cluster``: the benchmark's ZooKeeper and bookies (``pids`` given).

A process that starts and ends inside one phase is missed (Spark keeps its Python workers for
the session, so few are); a process gone by the end is counted up to its last sample.
:func:`peak_rss_mb` is the driver's peak resident set (``getrusage``: the high-water mark of the
whole run, the history's writing included), :func:`peak_rss_since_reset_mb` its peak since
:func:`reset_peak_rss` (``VmHWM``, started again at Spark's start: the pipeline's own), and
:func:`jvm_peak_rss_mb` the JVM's (``VmHWM``).

Example::

    cpu = PhaseCpu(jvm_pid=spark.sparkContext._gateway.proc.pid, cluster=bc.bookie_pids)
    with cpu.phase("analyze"):
        run_analyze(...)
    cpu.seconds      # {"analyze": {"driver": 3.1, "spark": 41.0, "cluster": 2.2, "total": 46.3}}
"""

from __future__ import annotations

import contextlib
import os
import resource
from typing import Iterable, Iterator

from bench.proc_stats import cpu_s


def _children() -> dict[int, list[int]]:
    """Every live process's children, from ``/proc/*/stat`` (the parent pid is its fourth field)."""
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                text = fh.read()
        except OSError:
            continue
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(name))
    return tree


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process under it."""
    tree, out, todo = _children(), [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(tree.get(current, ()))
    return out


class PhaseCpu:
    """CPU seconds per phase and per group of processes (see the module's docstring)."""

    def __init__(self, jvm_pid: int | None, cluster: Iterable[int] = ()) -> None:
        self.jvm_pid = jvm_pid
        self.cluster = list(cluster)
        self.seconds: dict[str, dict[str, float]] = {}

    def _sample(self) -> dict[str, dict[int, float]]:
        groups = {"driver": [os.getpid()], "spark": [], "cluster": self.cluster}
        if self.jvm_pid is not None:
            groups["spark"] = descendants(self.jvm_pid)
        return {
            name: {pid: s for pid in pids if (s := cpu_s(pid)) is not None} for name, pids in groups.items()
        }

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        before = self._sample()
        try:
            yield
        finally:
            after = self._sample()
            used = {
                group: round(sum(s - before[group].get(pid, 0.0) for pid, s in after[group].items()), 2)
                for group in after
            }
            used["total"] = round(sum(used.values()), 2)
            self.seconds[name] = used


def reset_peak_rss() -> bool:
    """Start this process's peak resident set (``VmHWM``) again from its current size (Linux: writing 5 to
    ``/proc/self/clear_refs``); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_rss_since_reset_mb() -> float | None:
    """This process's ``VmHWM`` in MiB: its peak resident set since :func:`reset_peak_rss`."""
    return jvm_peak_rss_mb(os.getpid())


def peak_rss_mb() -> float:
    """The driver's peak resident set so far, in MiB (Linux gives ``ru_maxrss`` in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def jvm_peak_rss_mb(pid: int | None) -> float | None:
    """The peak resident set (``VmHWM``) of process ``pid`` (the JVM) in MiB, or None when it is not known."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None
