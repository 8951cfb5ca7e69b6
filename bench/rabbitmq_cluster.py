"""One private RabbitMQ node, or three clustered, for ``bench peer``; always stopped at the end.

Every node runs on this machine on 127.0.0.1 with its own name, AMQP and
distribution ports and data directory (:mod:`bench.rabbitmq`); the nodes of one
cluster share one private epmd (on a free port, not 4369) and one Erlang
cookie. With three nodes, node 0 boots alone, then nodes 1 and 2 boot together
and join it on their first boot (classic config peer discovery); the cluster is
checked with ``rabbitmqctl cluster_status`` before it is used.

Clients spread over the nodes: :meth:`RabbitCluster.parameters` ``(i)`` is node
``i mod size``. A quorum queue declared on node 0 has its leader there (RabbitMQ's
``client-local`` leader locator), and ``x-quorum-initial-group-size`` of the
cluster's size puts a member on every node (:meth:`RabbitCluster.queue_arguments`).

Example::

    with RabbitCluster(size=3) as rc:
        admin = pika.BlockingConnection(rc.parameters(0))
        admin.channel().queue_declare("q", durable=True, arguments=rc.queue_arguments())
        consumer = pika.BlockingConnection(rc.parameters(1))   # node 1
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from bench.common import BenchError
from bench.rabbitmq import (
    START_TIMEOUT_S,
    NodeProcess,
    cli_env,
    find_server,
    free_port,
    missing_message,
    node_env,
    start_epmd,
    stop_process,
)

CLI_TIMEOUT_S = 60.0


class RabbitCluster:
    """``size`` private RabbitMQ nodes (1 or more), started by ``__enter__``, stopped by ``__exit__``.

    ``version`` is the server's version, ``up_s`` the seconds it took to start.
    """

    def __init__(
        self, size: int = 1, server: str | None = None, progress: Callable[[str], None] | None = None
    ) -> None:
        if size < 1:
            raise BenchError("a RabbitMQ cluster has at least one node")
        self.size = size
        self.server = server or find_server()
        if not self.server:
            raise BenchError(missing_message(server=None) or "rabbitmq-server not found")
        self.progress = progress or (lambda _msg: None)
        self.base: Path | None = None
        self.nodes: list[NodeProcess] = []
        self.version: str | None = None
        self.up_s: float | None = None
        self._epmd: subprocess.Popen | None = None

    def parameters(self, index: int = 0) -> Any:
        """pika's connection parameters for node ``index mod size``."""
        return self.nodes[index % self.size].parameters()

    def queue_arguments(self) -> dict:
        """A durable quorum queue's arguments, with a member on every node."""
        return {"x-queue-type": "quorum", "x-quorum-initial-group-size": self.size}

    def process_kinds(self) -> dict[str, list[int]]:
        """``rabbitmq``: every process of every node (beam.smp and its helpers); ``client``: this process."""
        return {"rabbitmq": [pid for node in self.nodes for pid in node.pids()], "client": [os.getpid()]}

    def leader_pid(self) -> int | None:
        """The beam.smp of node 0, where the bench declares its queues (so their leader)."""
        return self.nodes[0].beam_pid() if self.nodes else None

    def __enter__(self) -> "RabbitCluster":
        started = time.monotonic()
        self.base = Path(tempfile.mkdtemp(prefix="fencepost-rabbitmq-"))
        try:
            self._start(started + START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        self.up_s = time.monotonic() - started
        self.progress(
            f"rabbitmq {self.version}: {self.size} node(s) up on 127.0.0.1 ports "
            f"{', '.join(str(n.port) for n in self.nodes)} in {self.up_s:.1f}s"
        )
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _start(self, deadline: float) -> None:
        assert self.base is not None
        epmd_port, cookie, tag = free_port(), uuid.uuid4().hex, uuid.uuid4().hex[:8]
        names = [f"fencepost-bench-{tag}-{i}@localhost" for i in range(self.size)]
        for i, name in enumerate(names):
            base = self.base / f"node{i}"
            base.mkdir()
            port = free_port()
            env = node_env(base, port, free_port(), epmd_port, name, cookie, join=names[0] if i else None)
            self.nodes.append(NodeProcess(self.server, base, port, env))
        self._epmd = start_epmd(self.nodes[0].env, self.base / "epmd.out")
        self.nodes[0].start()
        self.nodes[0].wait_ready(deadline)
        for node in self.nodes[1:]:  # together: each joins node 0
            node.start()
        for node in self.nodes[1:]:
            node.wait_ready(deadline)
        self.version = self.nodes[0].version
        if self.size > 1:
            self._check_members(names)

    def _check_members(self, names: list[str]) -> None:
        """Refuse to measure a 'cluster' whose nodes did not all join (each would run alone)."""
        ctl = str(Path(self.server).with_name("rabbitmqctl"))
        env = cli_env(self.nodes[0].env, free_port())
        try:
            out = subprocess.run(
                [ctl, "-n", names[0], "cluster_status", "--formatter", "json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=CLI_TIMEOUT_S,
                cwd=self.base,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BenchError(f"rabbitmqctl cluster_status failed: {exc}") from None
        try:
            running = set(json.loads(out.stdout).get("running_nodes", []))
        except ValueError:
            raise BenchError(
                f"rabbitmqctl cluster_status said: {' '.join((out.stdout + out.stderr).split())[:400]}"
            ) from None
        if running != set(names):
            raise BenchError(f"only {sorted(running)} of {len(names)} RabbitMQ nodes formed the cluster")

    def stop(self) -> None:
        """Stop every node (SIGTERM, SIGKILL after a while), then epmd; remove the files. Idempotent."""
        for node in reversed(self.nodes):
            node.stop()
        self.nodes = []
        if self._epmd is not None:
            stop_process(self._epmd, 5.0)
            self._epmd = None
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None
