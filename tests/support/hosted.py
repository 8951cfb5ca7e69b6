"""Keyed load and its history check for tests on test hosts (``DevCluster(..., private=True)`` with ``hosts``).

:class:`KeyedLoad` runs producer threads in the test process: each submits one key
after another and tries a key again until it is acknowledged, and every attempt
is recorded as an :class:`Attempt` (its times, the outcome, the broker that
answered). :func:`probe_first_write` is a client started right after a fault:
it loops short keyed submits until a broker other than the old leader
acknowledges one. ``python -m tests.support.hosted produce ...`` runs the same
producer loop as a process, for a client on a host of its own, appending each
attempt to a JSON-lines file (:func:`read_attempts`). :func:`observe` looks up
every acknowledged task, submits every key once more, reads the queue's size and
waits until one broker leads and every broker is at its position, as a chaos run
does, giving a :class:`devtools.history.History` for :func:`devtools.history.check`;
:func:`converged` waits until every broker also holds one digest. :func:`leftovers`
lists what of a test network is still on the machine.

Example::

    logs = log_sizes(dev)
    load = KeyedLoad(zk, "parts", "q-cut", threads=2)
    load.start(); load.wait_acks(100, 30, "load to start"); ...; load.stop()
    history = observe(dev, zk, "parts", "q-cut", load.submits(), workers.completions(), logs)
    assert check(history) == [] and converged(dev)
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from broker.admin.status import ask
from broker.api.client import BrokerUnavailable, Client, ClientError
from devtools.chaos_observe import Observer
from devtools.devcluster import DevCluster
from devtools.history import History, Submit, crash_lines
from devtools.load import payload_for
from devtools.procs import pid_alive
from election.wire.exchange import NoReply, exchange


@dataclass
class Attempt:
    """One submit call of a key: when it started and ended (monotonic), its outcome, who answered."""

    key: str
    started: float
    ended: float
    ok: bool
    task_id: str | None = None
    error: str | None = None
    leader: str | None = None  # the client's leader after the call: the broker that acknowledged it

    def submit(self) -> Submit:
        return Submit(self.key, payload_for(self.key), self.ok, self.task_id, self.error)


def submit_once(client: Client, queue: str, key: str) -> Attempt:
    """One keyed submit through ``client``, recorded whatever its outcome."""
    started = time.monotonic()
    try:
        task_id = client.submit(queue, payload_for(key).encode(), key=key)
    except ClientError as exc:
        return Attempt(key, started, time.monotonic(), ok=False, error=exc.code)
    return Attempt(key, started, time.monotonic(), ok=True, task_id=task_id, leader=client.leader)


def direct_submit(address: str, queue: str, key: str, timeout: float = 5.0) -> tuple[Attempt, dict]:
    """One keyed submit sent to the broker at ``address`` itself (no leader lookup, no retry), and its reply."""
    started = time.monotonic()
    try:
        reply = exchange(address, "submit", timeout, queue=queue, payload=payload_for(key).encode(), key=key)
    except NoReply as exc:
        reply = {"ok": False, "error": exc.code}
    ok = bool(reply.get("ok"))
    attempt = Attempt(key, started, time.monotonic(), ok, reply.get("task_id"), reply.get("error"), address)
    return attempt, reply


def open_client(zk: str, cluster: str, timeout: float, request_timeout: float, stop: threading.Event):
    """A client once ZooKeeper answers (None if stopped first)."""
    while not stop.is_set():
        try:
            return Client(zk=zk, cluster=cluster, timeout=timeout, request_timeout=request_timeout)
        except BrokerUnavailable:
            stop.wait(0.5)
    return None


def produce(
    zk: str,
    cluster: str,
    queue: str,
    tag: str,
    rate: float,
    stop: threading.Event,
    record,
    timeout: float = 6.0,
    request_timeout: float = 2.0,
) -> None:
    """Submit keys ``<tag>-0``, ``<tag>-1``, ... at about ``rate`` per second until ``stop``; each key is
    tried again until acknowledged (or stopped), and ``record(attempt)`` is called for every attempt."""
    client = open_client(zk, cluster, timeout, request_timeout, stop)
    if client is None:
        return
    period = 1.0 / rate
    next_at = time.monotonic()
    try:
        n = 0
        while not stop.is_set():
            key = f"{tag}-{n}"
            n += 1
            while not stop.is_set():
                attempt = submit_once(client, queue, key)
                record(attempt)
                if attempt.ok:
                    break
                stop.wait(0.05)
            next_at = max(next_at + period, time.monotonic() - 1.0)
            stop.wait(max(0.0, next_at - time.monotonic()))
    finally:
        client.close()


class KeyedLoad:
    """Producer threads in this process (see the module docstring); ``attempts()`` is what they did."""

    def __init__(
        self, zk: str, cluster: str, queue: str, threads: int = 2, rate: float = 20.0, tag: str = "k"
    ) -> None:
        self._attempts: list[Attempt] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(
                target=produce,
                args=(zk, cluster, queue, f"{tag}{i}", rate, self._stop, self._record),
                name=f"keyed-load-{i}",
                daemon=True,
            )
            for i in range(threads)
        ]

    def _record(self, attempt: Attempt) -> None:
        with self._lock:
            self._attempts.append(attempt)

    def start(self) -> "KeyedLoad":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop and wait for the calls in flight (their outcome is recorded)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)

    def attempts(self) -> list[Attempt]:
        with self._lock:
            return list(self._attempts)

    def submits(self) -> list[Submit]:
        return [a.submit() for a in self.attempts()]

    def acked(self) -> int:
        with self._lock:
            return sum(1 for a in self._attempts if a.ok)

    def wait_acks(self, more: int, timeout: float, what: str) -> None:
        """Wait until ``more`` acknowledgements beyond the present ones came."""
        target = self.acked() + more
        deadline = time.monotonic() + timeout
        while self.acked() < target:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout:g}s waiting for {what} ({self.acked()}/{target})"
                )
            time.sleep(0.1)


def longest_gap(attempts: list[Attempt], since: float, until: float) -> float:
    """The longest time without an acknowledgement between ``since`` and ``until`` (monotonic)."""
    times = sorted(a.ended for a in attempts if a.ok and since <= a.ended <= until)
    edges = [since, *times, until]
    return max(b - a for a, b in zip(edges, edges[1:]))


def probe_first_write(
    zk: str, cluster: str, queue: str, old: str, since: float, tag: str, give_up: float = 60.0
) -> tuple[float | None, list[Attempt]]:
    """Seconds from ``since`` until a keyed submit started after it is acknowledged by a broker other
    than ``old`` (None if none within ``give_up``), and every attempt the probe made."""
    attempts: list[Attempt] = []
    stop = threading.Event()
    client = open_client(zk, cluster, 1.0, 0.25, stop)
    try:
        n = 0
        while time.monotonic() < since + give_up:
            attempt = submit_once(client, queue, f"{tag}-{n}")
            attempts.append(attempt)
            if attempt.ok:
                n += 1
                if attempt.leader != old:
                    return attempt.ended - since, attempts
    finally:
        client.close()
    return None, attempts


# ------------------------------------------------------------------ after the load


def brokers(dev: DevCluster) -> list[dict]:
    return [m for m in dev.read_state()["processes"] if m["kind"] == "broker"]


def broker_statuses(dev: DevCluster, timeout: float = 2.0) -> list[dict]:
    """Each broker member with its ``status`` reply (``reply`` None: no answer)."""
    members = brokers(dev)
    with ThreadPoolExecutor(len(members)) as pool:
        replies = list(pool.map(lambda m: ask(m["address"], "status", timeout=timeout), members))
    return [{**m, "reply": r} for m, r in zip(members, replies)]


def leader_of(dev: DevCluster, timeout: float = 60.0, not_address: str | None = None) -> dict:
    """The broker member that answers as leader (not ``not_address``), with its ``reply``."""
    deadline = time.monotonic() + timeout
    while True:
        rows = broker_statuses(dev)
        leaders = [
            r for r in rows if (r["reply"] or {}).get("role") == "leader" and r["address"] != not_address
        ]
        if len(leaders) == 1:
            return leaders[0]
        if time.monotonic() > deadline:
            seen = [(r["host"], (r["reply"] or {}).get("role")) for r in rows]
            raise AssertionError(f"no single leader within {timeout:g}s: {seen}")
        time.sleep(0.2)


def converged(dev: DevCluster, timeout: float = 60.0) -> list[dict]:
    """Wait until one broker leads and every broker answers at one position with one digest; the rows.

    Raises AssertionError naming what each broker said when they do not within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        rows = broker_statuses(dev)
        replies = [r["reply"] for r in rows]
        if all(replies):
            leaders = [r for r in replies if r["role"] == "leader"]
            positions = {tuple(r["position"] or ()) for r in replies}
            digests = {r["digest"] for r in replies}
            if len(leaders) == 1 and len(positions) == 1 and len(digests) == 1:
                return rows
        if time.monotonic() > deadline:
            seen = [
                (
                    r["host"],
                    r["reply"] and {k: r["reply"][k] for k in ("role", "epoch", "position", "digest")},
                )
                for r in rows
            ]
            raise AssertionError(f"the brokers did not converge within {timeout:g}s: {seen}")
        time.sleep(0.3)


def log_sizes(dev: DevCluster) -> dict[str, int]:
    """How far each broker's log goes now (so a check reads only what a test added)."""
    sizes = {}
    for member in brokers(dev):
        path = Path(member["log"])
        sizes[member["log"]] = path.stat().st_size if path.exists() else 0
    return sizes


def observe(
    dev: DevCluster,
    zk: str,
    cluster: str,
    queue: str,
    submits: list[Submit],
    completions: list,
    logs_from: dict[str, int],
    timeout: float = 90.0,
) -> History:
    """The history of a test's load with what the cluster shows once it settled, as a chaos run observes
    it (:class:`devtools.chaos_observe.Observer`), but with the crash lines the broker logs got after
    ``logs_from`` only (the cluster may have served earlier tests) and the members found dead."""
    history = History(queue=queue, submits=list(submits), completions=list(completions))
    obs = Observer(cluster, queue, settle_timeout_s=timeout).observe(dev, zk, history)
    obs.log_lines = []
    for member in dev.read_state()["processes"]:
        if not pid_alive(member["pid"]):
            obs.deaths.append({"member": f"{member['kind']}-{member.get('index')}", "exit_code": None})
        if member["kind"] == "broker":
            with open(member["log"], "rb") as log:
                log.seek(logs_from.get(member["log"], 0))
                text = log.read().decode(errors="replace")
            obs.log_lines += [[member["host"], line] for line in crash_lines(text)]
    history.observed = obs
    return history


# ------------------------------------------------------------------ what a test network leaves


def leftovers(index: int, run_dir: Path) -> list[str]:
    """What of test network ``index`` (and the processes of ``run_dir``) is still on the machine."""
    left = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    left += [f"namespace {n}" for n in netns if n.startswith(f"fp{index}-")]
    for line in subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True
    ).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name == f"fpbr{index}" or re.fullmatch(rf"fp{index}v\d+", name):
            left.append(f"link {name}")
    for base in (Path("/sys/fs/cgroup/cpu/fencepost"), Path("/sys/fs/cgroup/fencepost")):
        left += [f"cgroup {p}" for p in sorted(base.glob(f"{index}-*"))]
    forward = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True).stdout
    left += [f"FORWARD rule {line}" for line in forward.splitlines() if re.search(rf"\bfpbr{index}\b", line)]
    marker = str(run_dir).encode()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_bytes():
                left.append(f"process {proc.name}: {(proc / 'cmdline').read_bytes()[:200]!r}")
        except OSError:
            continue
    return left


# ------------------------------------------------------------------ a producer process


def read_attempts(path: Path) -> list[Attempt]:
    """The attempts a producer process recorded; a line cut by a kill is skipped."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        try:
            out.append(Attempt(**json.loads(line)))
        except (ValueError, TypeError):
            continue
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A keyed producer process of the tests on test hosts.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("produce", help="submit keyed tasks until SIGTERM, one JSON line per attempt")
    p.add_argument("--zk", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--rate", type=float, default=10.0)
    p.add_argument(
        "--timeout", type=float, default=60.0, help="each submit call's deadline, retries included"
    )
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with open(args.out, "a", buffering=1) as out:

        def record(attempt: Attempt) -> None:
            out.write(json.dumps(asdict(attempt)) + "\n")

        print("producing", flush=True)
        produce(args.zk, args.cluster, args.queue, args.tag, args.rate, stop, record, timeout=args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
