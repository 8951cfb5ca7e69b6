"""Added latency on a test host's link: ``tc netem`` where the kernel has it, else a delayer.

netem is the usual tool (it delays what the host sends), but some kernels are built
without it (``sch_netem``); there the packets the host receives go through NFQUEUE to
:mod:`devtools.hosts.delayer`, a small process in the host's namespace that holds each
one for the delay. Either way every round trip through the host grows by the delay. Which one a
host uses is decided by trying netem once per host. Packet loss is not here: the
firewall drops a share of packets at random on every kernel (:mod:`devtools.hosts.firewall`).

Example::

    delay = Latency(run_dir, private=False)
    pid = delay.start("fp3-h1", 40.0)      # the delayer's pid, or None with netem
    delay.stop("fp3-h1", pid)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from devtools.hosts.netns import in_netns, run
from devtools.hosts.plan import HostsError
from devtools.procs import REPO_ROOT, fencepost_env, pid_alive, spawn, stop_pid

DELAYER_READY = "delayer: queue"
START_TIMEOUT_S = 15.0


class Latency:
    """Starts and stops the added latency of hosts whose files live in ``run_dir``."""

    def __init__(self, run_dir: Path, private: bool) -> None:
        self.run_dir = run_dir
        self.private = private

    def start(self, netns: str, delay_ms: float, queue_num: int = 0) -> int | None:
        """Delay what ``netns`` sends by ``delay_ms``; the delayer's pid (None: netem does it)."""
        netem = ["tc", "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", f"{delay_ms:g}ms"]
        if run(in_netns(netns, netem), check=False).returncode == 0:
            return None
        log = self.run_dir / f"delayer-{netns}.log"
        log.write_bytes(b"")
        command = [
            sys.executable,
            "-m",
            "devtools.hosts.delayer",
            "--queue-num",
            str(queue_num),
            "--delay-ms",
            f"{delay_ms:g}",
        ]
        proc = spawn(
            in_netns(netns, command),
            log,
            env=fencepost_env(),
            cwd=REPO_ROOT,
            die_with_parent=self.private,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while DELAYER_READY not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_pid(proc.pid, "devtools.hosts.delayer")
                tail = log.read_text(errors="replace").strip().splitlines()
                raise HostsError(f"the delayer of {netns} did not start: {tail[-1] if tail else 'no output'}")
            time.sleep(0.02)
        return proc.pid

    def stop(self, netns: str, pid: int | None) -> None:
        """Remove the host's added latency (netem qdisc or delayer)."""
        if pid is not None:
            if pid_alive(pid):
                stop_pid(pid, "devtools.hosts.delayer", timeout=5.0)
        else:
            run(in_netns(netns, ["tc", "qdisc", "del", "dev", "eth0", "root"]), check=False)
