"""A broker's processes for its other shards: started once its id is claimed, started again when they die,
stopped with it.

In a cluster of S > 1 shards the broker an operator starts serves shard 0 and runs one process
for each shard 1..S-1 (its command line and environment: :mod:`broker.server.shard_command`;
what it does differently: :mod:`broker.server.shard_process`):

- each child runs in a process group of its own, so a signal meant for the broker's group reaches
  the broker, which stops its children in order; and it dies with the broker (a SIGKILLed
  broker takes its replica of every shard with it);
- a child writes to the broker's stdout and stderr: its log lines go where the broker's go, each
  naming its shard;
- a child that ends unexpectedly (killed, or an exit code other than 0) is started again after a
  backoff (1 s, doubling to 60 s; 1 s again once a child had run a minute), with one log line
  each time. One that exits 0 stopped in order (a SIGTERM from someone, or a cluster shutdown of
  its shard) and stays stopped: started again, it would mark dirty a store that shutdown left clean;
- when the broker's stop begins, every child gets SIGTERM at once (it stops within a share of
  the broker's ``shutdown_timeout_s``) and the broker waits for them within its own budget; one
  still running when that runs out is SIGKILLed.

One thread (``shard-children``) starts, watches and stops the children and lives until they are
gone: Linux ties ``PR_SET_PDEATHSIG`` to the thread that started a child, not to its process.

Example::

    children = ShardChildren(config, shards=3, stop=stop_event, remaining=budget.remaining)
    children.start()
    ...
    children.close(timeout=budget.remaining(10.0))   # after the stop event is set, or at the end
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Callable

from broker.server.config import BrokerConfig
from broker.server.shard_command import RestartBackoff, child_command, child_env, free_address
from election.cluster_config import cluster_shards
from election.local.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

# How often the children are looked at while the broker runs.
POLL_S = 0.2
# Kept from the broker's stop budget to kill and reap children that did not stop in time.
KILL_MARGIN_S = 0.3
_LOG_LEVELS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning"}


@dataclass
class _Child:
    shard: int
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    # When to start it (again); None: it stopped in order and stays stopped.
    start_at: float | None = 0.0


def logging_options() -> tuple[str, bool]:
    """This process's log level (as `--log-level` takes it) and whether it logs JSON lines."""
    root = logging.getLogger()
    level = _LOG_LEVELS.get(root.getEffectiveLevel(), "error")
    # cli.JsonLogFormatter: the product does not import the command line, so it is known by name.
    as_json = any(type(h.formatter).__name__ == "JsonLogFormatter" for h in root.handlers)
    return level, as_json


def how_it_ended(code: int) -> str:
    """``killed by SIGKILL``, ``exited with code 1``: how a child process ended."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class ShardChildren:
    """The processes of shards 1..``shards``-1 of the broker configured by ``config``."""

    def __init__(
        self,
        config: BrokerConfig,
        shards: int,
        stop: threading.Event,
        remaining: Callable[[float], float],
        clock: Clock = SYSTEM_CLOCK,
        popen: Callable[..., subprocess.Popen] = subprocess.Popen,
    ) -> None:
        self.config = config
        self.stop = stop
        # How long the broker's stop budget still allows (at most the cap it is given).
        self.remaining = remaining
        self.clock = clock
        self._popen = popen
        self.children = [_Child(shard) for shard in range(1, shards)]
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shard-children", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float) -> None:
        """Stop the children (if the broker's stop has not already) and wait up to ``timeout`` for them."""
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def pids(self) -> dict[int, int]:
        """The pid of each shard's running process (for logs and tests)."""
        return {c.shard: c.proc.pid for c in self.children if c.proc is not None}

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            while not (self.stop.is_set() or self._closing.is_set()):
                try:
                    self._turn()
                except Exception:  # a bug here must not leave the shards unwatched: log it, go on
                    log.exception("watching the shards' processes")
                self.clock.wait(self.stop, POLL_S)
        finally:
            self._stop_children()

    def _turn(self) -> None:
        now = self.clock.monotonic()
        for child in self.children:
            if child.proc is not None and child.proc.poll() is not None:
                self._ended(child, now)
            if child.proc is None and child.start_at is not None and now >= child.start_at:
                self._spawn(child, now)

    def _spawn(self, child: _Child, now: float) -> None:
        cfg = self.config
        level, as_json = logging_options()
        try:
            listen = free_address(cfg.listen)
            metrics = free_address(cfg.metrics_listen) if cfg.metrics_listen else ""
            child.proc = self._popen(
                child_command(cfg, child.shard, listen, metrics, level, as_json),
                env=child_env(os.environ, child.shard, os.getpid()),
                stdin=subprocess.DEVNULL,
                process_group=0,
            )
        except OSError as exc:
            delay = child.backoff.delay(0.0)
            log.error(
                "shard %d: cannot start its process (%s): trying again in %.1f s", child.shard, exc, delay
            )
            child.start_at = now + delay
            return
        child.started_at = now
        log.info("shard %d: started its process (pid %d) on %s", child.shard, child.proc.pid, listen)

    def _ended(self, child: _Child, now: float) -> None:
        proc, child.proc = child.proc, None
        if proc.returncode == 0:
            log.info(
                "shard %d: its process (pid %d) stopped in order: not starting it again",
                child.shard,
                proc.pid,
            )
            child.start_at = None
            return
        ran = now - child.started_at
        delay = child.backoff.delay(ran)
        log.warning(
            "shard %d: its process (pid %d) %s after %.1f s: starting it again in %.1f s",
            child.shard,
            proc.pid,
            how_it_ended(proc.returncode),
            ran,
            delay,
        )
        child.start_at = now + delay

    def _stop_children(self) -> None:
        """SIGTERM every child, wait within the broker's budget, SIGKILL what is left; reap them all and
        say how each ended (one stopped by a cluster shutdown of its shard may have exited already)."""
        running = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        for proc in running:
            try:
                proc.terminate()
            except ProcessLookupError:
                pass
        budget = self.remaining(self.config.shutdown_timeout_s) - KILL_MARGIN_S
        deadline = self.clock.monotonic() + max(0.0, budget)
        while any(p.poll() is None for p in running) and self.clock.monotonic() < deadline:
            self.clock.sleep(0.02)
        for proc in running:
            if proc.poll() is None:
                log.warning("the process of a shard (pid %d) did not stop in time: killing it", proc.pid)
                proc.kill()
            proc.wait()
        for child in self.children:
            if child.proc is not None:
                log.info(
                    "shard %d: its process (pid %d) %s",
                    child.shard,
                    child.proc.pid,
                    how_it_ended(child.proc.returncode),
                )


def start_shard_children(
    config: BrokerConfig,
    cluster: dict,
    stop: threading.Event,
    remaining: Callable[[float], float],
    clock: Clock = SYSTEM_CLOCK,
) -> ShardChildren | None:
    """The running processes of the other shards of ``cluster`` (its config) when ``config`` is the
    broker of shard 0 of a cluster of several shards; None otherwise."""
    shards = cluster_shards(cluster)
    if config.shard or shards == 1:
        return None
    children = ShardChildren(config, shards, stop, remaining, clock=clock)
    children.start()
    return children
