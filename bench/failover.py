"""`fencepost bench failover`: how long writes stop when the leader dies or hands over.

Run as ``python -m bench.failover [--json] [--rounds N]`` (or ``fencepost bench
failover``). It starts a private dev cluster (ZooKeeper, 3 bookies, 3 brokers,
ZooKeeper session timeout ``--zk-session-timeout``, 2 s by default) in a
temporary directory and stops it at the end, whatever happens. While
``producers`` threads submit (``submit_many`` of ``batch`` tasks with keys), each
round:

1. **kill**: SIGKILLs the leader broker's process group; the failover time is from
   the kill to the first submit of a *probe* that was started after the kill and
   acknowledged by the new leader. The probe
   loops on short calls (``--probe-timeout``, 0.5 s, each with the client's usual
   leader discovery and backoff), so it notices the new leader within ~50 ms.
2. restarts the killed broker (same command line, recorded in ``cluster.json``)
   and waits until it has caught up with the leader;
3. **graceful**: SIGTERMs the (new) leader, which hands leadership over at once;
   measured the same way; then restarts that broker too;
4. **elect**: ``admin elect`` hands leadership to an in-sync follower (the leader steps
   down once the target is next in line); measured the same way.

After the rounds, one **lagging joiner** round: a broker with an empty data dir joins
(it replays the whole history, so it is not in the in-sync set) and the leader is
SIGKILLed at once; an in-sync follower must take over within the kill target
(``lagging_joiner_kill_s``; ``lagging_joiner_led`` must be false).

Also reported per event: when the new leader was elected and how long its
takeover took (``*_elected_s``, ``*_takeover_s``, from the brokers' logs), when
ZooKeeper's ``leader`` node named it (``*_published_s``), and how long the
producers stalled (from the event to their
first acknowledged call started after it). At the end the acknowledged tasks
are compared with the tasks the leader holds (``lost``/``duplicated``, both
must be 0).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

from bench.common import BenchError, finish, machine_info, percentile
from bench.devbench import BenchCluster, quiet_logs

TARGETS = {
    "kill_median_s": 3.0,
    "graceful_median_s": 0.5,
    "elect_median_s": 0.5,
    "lagging_joiner_kill_s": 3.0,
}
LABELS = {
    "kill_median_s": "SIGKILL leader: first new write, median (s)",
    "kill_max_s": "SIGKILL leader: first new write, max (s)",
    "graceful_median_s": "SIGTERM leader: first new write, median (s)",
    "graceful_max_s": "SIGTERM leader: first new write, max (s)",
    "elect_median_s": "admin elect: first new write, median (s)",
    "lagging_joiner_kill_s": "SIGKILL leader with a lagging joiner: first new write (s)",
}


class Producers:
    """Threads submitting batches with keys, each call retried (by the client) until acknowledged."""

    def __init__(self, bc: BenchCluster, queue: str, threads: int, batch: int) -> None:
        self.queue, self.batch = queue, batch
        self.client = bc.client(timeout=60.0, request_timeout=1.0)
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.acked: set[str] = set()
        self.calls: list[tuple[float, float]] = []  # (started, acknowledged), monotonic
        self.errors: list[str] = []
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True, name=f"producer-{i}")
            for i in range(threads)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _run(self, index: int) -> None:
        n = 0
        while not self.stop_event.is_set():
            keys = [f"p{index}-{n + i}" for i in range(self.batch)]
            n += self.batch
            t0 = time.monotonic()
            try:
                ids = self.client.submit_many(
                    [{"queue": self.queue, "payload": b"x" * 100, "key": k} for k in keys]
                )
            except Exception as exc:  # noqa: BLE001 - counted; these tasks count as not acknowledged
                with self.lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            t1 = time.monotonic()
            with self.lock:
                self.acked.update(ids)
                self.calls.append((t0, t1))
            time.sleep(0.005)  # "a few producers", not a saturation test

    def stall_after(self, since: float) -> float | None:
        """Seconds from ``since`` to the first acknowledged call that started after it."""
        with self.lock:
            acks = [t1 for t0, t1 in self.calls if t0 >= since]
        return min(acks) - since if acks else None

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(90)
        self.client.close()


class LeaderWatch:
    """Records when ZooKeeper's ``leader`` node changes (address and monotonic time)."""

    def __init__(self, bc: BenchCluster) -> None:
        from election.paths import ClusterPaths
        from election.zk import connect

        self.zk = connect(bc.zk, session_timeout=10.0)
        self.lock = threading.Lock()
        self.changes: list[tuple[float, str | None]] = []
        self.zk.DataWatch(ClusterPaths(bc.cluster).leader, self._on_change)

    def _on_change(self, data, _stat) -> None:
        try:
            address = json.loads(data).get("address") if data else None
        except ValueError:
            address = None
        with self.lock:
            self.changes.append((time.monotonic(), address))

    def published_after(self, since: float, old: str) -> float | None:
        """Seconds from ``since`` until the node first named a leader other than ``old``."""
        with self.lock:
            times = [t for t, a in self.changes if t >= since and a and a != old]
        return min(times) - since if times else None

    def close(self) -> None:
        from election.zk import close

        close(self.zk)


def probe_first_write(
    client, queue: str, old: str, since: float, call_timeout: float, give_up: float = 60.0
) -> float:
    """Seconds from ``since`` until a submit started after it is acknowledged by a leader other than ``old``.

    Loops short calls. After a SIGTERM the old leader may still commit for a
    moment; those acknowledgements do not count (the client's current leader
    after the call is the broker that answered).
    """
    from broker.api.client import submit_fields

    deadline = since + give_up
    while time.monotonic() < deadline:
        try:
            client.call("submit", timeout=call_timeout, **submit_fields(queue, b"probe"))
        except Exception:  # noqa: BLE001 - not yet: try again at once (the client already backed off)
            continue
        done = time.monotonic()
        if client.leader != old:
            return done - since
    raise BenchError(f"no write was acknowledged within {give_up:g}s of the leader change")


_LOG_TIME = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?(elected; taking over with epoch (\d+)"
    r"|leading epoch (\d+))"
)


def takeover_phases(bc: BenchCluster, since_wall: float) -> dict:
    """From the brokers' logs: seconds from ``since_wall`` (time.time()) to the first "elected" after it
    and to the matching "leading epoch" line. Empty if the logs do not say (another log format)."""
    elected: list[tuple[float, str]] = []
    leading: dict[str, float] = {}
    for member in bc.members("broker"):
        try:
            lines = Path(member["log"]).read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            m = _LOG_TIME.match(line)
            if not m:
                continue
            t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if t < since_wall - 0.002:  # log times have ms resolution
                continue
            if m.group(3):
                elected.append((t, m.group(3)))
            else:
                leading.setdefault(m.group(4), t)
    if not elected:
        return {}
    t_elected, epoch = min(elected)
    out = {"elected_s": round(max(0.0, t_elected - since_wall), 3)}
    if epoch in leading:
        out["takeover_s"] = round(leading[epoch] - t_elected, 3)
    return out


def _broker_id(member: dict) -> int | None:
    from devtools.devcluster import read_broker_id

    return read_broker_id(Path(member["data_dir"]))


def restart_member(bc: BenchCluster, member: dict) -> dict:
    """Start a stopped broker again with its recorded command line (its new pid is recorded in cluster.json)."""
    from devtools.devcluster import DevClusterError

    try:
        return dict(bc.dev.restart(member, wait=False))
    except DevClusterError as exc:
        raise BenchError(str(exc)) from None


def wait_caught_up(bc: BenchCluster, member: dict, timeout: float = 60.0) -> float:
    """Wait until the broker's ``brokers/live/<id>`` position reaches the leader's current one; seconds waited."""
    from election.live import read_live_broker
    from election.paths import ClusterPaths
    from election.zk import close, connect

    started = time.monotonic()
    with bc.client(timeout=30.0) as client:
        target = client.status().get("position")
    paths = ClusterPaths(bc.cluster)
    zk = connect(bc.zk, session_timeout=10.0)
    try:
        while time.monotonic() - started < timeout:
            broker_id = _broker_id(member)
            info = read_live_broker(zk, paths, broker_id) if broker_id is not None else None
            if info:
                pos = info.get("position")
                if pos and (not target or tuple(pos) >= tuple(target)):
                    return time.monotonic() - started
            time.sleep(0.05)
    finally:
        close(zk)
    raise BenchError(f"broker {member['index']} did not catch up within {timeout:g}s")


def signal_leader(sig: int) -> Callable[[dict], None]:
    return lambda leader: os.killpg(leader["pid"], sig)


def elect_other(bc: BenchCluster, errors: list[str]) -> Callable[[dict], None]:
    """An event that runs ``admin elect`` of an in-sync follower in a thread (the probe runs meanwhile).

    The ZooKeeper session is opened beforehand, as the command has one before it asks.
    """
    from broker.admin.status import elect
    from election.insync import read_insync
    from election.paths import ClusterPaths
    from election.zk import close, connect

    zk = connect(bc.zk, session_timeout=10.0)

    def act(leader: dict) -> None:
        doc, _ = read_insync(zk, ClusterPaths(bc.cluster))
        targets = [m for m in (doc or {}).get("members", []) if m != _broker_id(leader)]
        if not targets:
            close(zk)
            raise BenchError(f"no in-sync follower to elect (in-sync set {doc})")

        def run() -> None:
            try:
                elect(zk, bc.cluster, targets[0])
            except Exception as exc:  # noqa: BLE001 - reported in the result
                errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                close(zk)

        threading.Thread(target=run, daemon=True, name="elect").start()

    return act


def one_event(
    bc: BenchCluster,
    producers: Producers,
    watch: LeaderWatch,
    queue: str,
    sig: int,
    probe_timeout: float,
    progress: Callable[[str], None],
    act: Callable[[dict], None] | None = None,
) -> tuple[dict, dict]:
    """Signal the leader with ``sig`` (or run ``act`` on its member record instead); return the
    measurements and the leader's member record."""
    from broker.api.client import submit_fields
    from devtools.procs import pid_alive

    leader, _followers = bc.leader_and_followers()
    old = leader["address"]
    probe_queue = queue + "-probe"  # probes that time out may still commit: keep them out of the count
    with bc.client(timeout=probe_timeout, request_timeout=min(0.25, probe_timeout)) as probe:
        # The probe is connected and knows the old leader before the event, like any client.
        probe.call("submit", timeout=30.0, **submit_fields(probe_queue, b"warm-up"))
        t_event, t_wall = time.monotonic(), time.time()
        (act or signal_leader(sig))(leader)
        first_write = probe_first_write(probe, probe_queue, old, t_event, probe_timeout)
    stall = None
    deadline = time.monotonic() + 30
    while stall is None and time.monotonic() < deadline:
        stall = producers.stall_after(t_event)
        if stall is None:
            time.sleep(0.02)
    # A graceful stop must also end the process; wait for it before restarting it.
    end = time.monotonic() + 30
    while act is None and pid_alive(leader["pid"]) and time.monotonic() < end:
        time.sleep(0.02)
    out = {
        "first_write_s": round(first_write, 3),
        "published_s": _round(watch.published_after(t_event, old)),
        "producer_stall_s": _round(stall),
        "exited": not pid_alive(leader["pid"]),
        **takeover_phases(bc, t_wall),
    }
    what = "elect" if act is not None else ("SIGKILL" if sig == signal.SIGKILL else "SIGTERM")
    progress(f"{what} (leader was broker {leader['index']}): {out}")
    return out, leader


def lagging_joiner_round(
    bc: BenchCluster,
    producers: Producers,
    watch: LeaderWatch,
    queue: str,
    probe_timeout: float,
    progress: Callable[[str], None],
) -> dict:
    """Add a broker with an empty data dir and SIGKILL the leader while it replays."""
    from broker.admin.status import insync_report
    from election.zk import close, connect

    joiner = bc.dev.add_broker()
    joiner_id = _broker_id(joiner)
    zk = connect(bc.zk, session_timeout=10.0)
    try:
        rows = {row["id"]: row for row in insync_report(zk, bc.cluster)["brokers"]}
    finally:
        close(zk)
    joiner_lag = (rows.get(joiner_id) or {}).get("lag")
    out, _ = one_event(bc, producers, watch, queue, signal.SIGKILL, probe_timeout, progress)
    new_leader = bc.leader_info() or {}
    out.update(
        joiner_id=joiner_id, joiner_lag=joiner_lag, joiner_led=new_leader.get("address") == joiner["address"]
    )
    progress(f"lagging joiner round: {out}")
    return out


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _median(values: list[float | None]) -> float | None:
    data = [v for v in values if v is not None]
    return round(percentile(data, 50), 3) if data else None


def _max(values: list[float | None]) -> float | None:
    data = [v for v in values if v is not None]
    return round(max(data), 3) if data else None


def run(
    rounds: int = 5,
    producers: int = 3,
    batch: int = 20,
    zk_session_timeout: float = 2.0,
    probe_timeout: float = 0.5,
    settle_s: float = 1.0,
    keep: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run the benchmark (see the module docstring); return the result dict."""
    progress = progress or (lambda _msg: None)
    if rounds < 1 or producers < 0 or not 1 <= batch <= 1000:
        raise BenchError("need rounds >= 1, producers >= 0, 1 <= batch <= 1000")
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    queue = f"failover-{uuid.uuid4().hex[:8]}"
    kills: list[dict] = []
    graceful: list[dict] = []
    elects: list[dict] = []
    elect_errors: list[str] = []
    catch_up: list[float] = []
    with BenchCluster(zk_session_timeout=zk_session_timeout, keep=keep, progress=progress) as bc:
        run_dir = str(bc.run_dir)
        prod = Producers(bc, queue, producers, batch)
        watch = LeaderWatch(bc)
        try:
            prod.start()
            time.sleep(settle_s)
            for r in range(rounds):
                for sig, results in ((signal.SIGKILL, kills), (signal.SIGTERM, graceful)):
                    out, member = one_event(bc, prod, watch, queue, sig, probe_timeout, progress)
                    out["round"] = r + 1
                    results.append(out)
                    member = restart_member(bc, member)
                    catch_up.append(round(wait_caught_up(bc, member), 3))
                    time.sleep(settle_s)  # steady load again before the next event
                out, _ = one_event(
                    bc, prod, watch, queue, 0, probe_timeout, progress, act=elect_other(bc, elect_errors)
                )
                out["round"] = r + 1
                elects.append(out)
                time.sleep(settle_s)
            joiner = lagging_joiner_round(bc, prod, watch, queue, probe_timeout, progress)
        finally:
            prod.stop()
            watch.close()
        with bc.client(timeout=60.0) as client:
            depth = client.status()["queues"].get(queue, {})
        stored = sum(v for k, v in depth.items() if k != "delayed")
        acked = len(prod.acked)
    kill_times = [k["first_write_s"] for k in kills]
    graceful_times = [g["first_write_s"] for g in graceful]
    result = {
        "kill_median_s": _median(kill_times),
        "kill_max_s": _max(kill_times),
        "graceful_median_s": _median(graceful_times),
        "graceful_max_s": _max(graceful_times),
        "elect_median_s": _median([e["first_write_s"] for e in elects]),
        "elect_max_s": _max([e["first_write_s"] for e in elects]),
        "lagging_joiner_kill_s": joiner["first_write_s"],
        "lagging_joiner_lag": joiner["joiner_lag"],
        "lagging_joiner_led": joiner["joiner_led"],
        "rounds": rounds,
        "kill_elected_median_s": _median([k.get("elected_s") for k in kills]),
        "kill_takeover_median_s": _median([k.get("takeover_s") for k in kills]),
        "kill_published_median_s": _median([k["published_s"] for k in kills]),
        "kill_producer_stall_median_s": _median([k["producer_stall_s"] for k in kills]),
        "graceful_elected_median_s": _median([g.get("elected_s") for g in graceful]),
        "graceful_takeover_median_s": _median([g.get("takeover_s") for g in graceful]),
        "graceful_published_median_s": _median([g["published_s"] for g in graceful]),
        "graceful_producer_stall_median_s": _median([g["producer_stall_s"] for g in graceful]),
        "restart_catch_up_median_s": _median(catch_up),
        "zk_session_timeout_s": zk_session_timeout,
        "producers": producers,
        "batch": batch,
        "acked": acked,
        "stored": stored,
        "lost": max(0, acked - stored),
        "duplicated": max(0, stored - acked),
        "producer_errors": len(prod.errors),
        "first_error": prod.errors[0] if prod.errors else None,
        "kills": kills,
        "graceful": graceful,
        "elects": elects,
        "elect_errors": elect_errors,
        "lagging_joiner": joiner,
        "started_at": started_at,
        "machine": machine_info(),
    }
    if keep:
        result["run_dir"] = run_dir  # broker logs for a closer look (the processes are stopped)
    result["targets"] = dict(TARGETS)
    result["targets_met"] = (
        result["kill_median_s"] is not None
        and result["kill_median_s"] <= TARGETS["kill_median_s"]
        and result["graceful_median_s"] is not None
        and result["graceful_median_s"] <= TARGETS["graceful_median_s"]
        and result["lost"] == 0
        and result["duplicated"] == 0
        and not elect_errors
        and result["elect_median_s"] is not None
        and result["elect_median_s"] <= TARGETS["elect_median_s"]
        and not joiner["joiner_led"]
        and joiner["first_write_s"] <= TARGETS["lagging_joiner_kill_s"]
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--rounds", type=int, default=5, help="kill + graceful handovers (default 5)")
    parser.add_argument("--producers", type=int, default=3, help="load threads (default 3)")
    parser.add_argument(
        "--batch", type=int, default=20, help="tasks per submit_many of the load (default 20)"
    )
    parser.add_argument(
        "--zk-session-timeout",
        type=float,
        default=2.0,
        help="the brokers' ZooKeeper session timeout (default 2 s)",
    )
    parser.add_argument(
        "--probe-timeout",
        type=float,
        default=0.5,
        help="each probe call's deadline before it starts again (default 0.5 s)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run directory (logs) afterwards")
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    args = parser.parse_args(argv)
    quiet_logs()
    progress = (lambda msg: print(msg, file=sys.stderr)) if args.verbose else None

    def measure() -> dict:
        return run(
            rounds=args.rounds,
            producers=args.producers,
            batch=args.batch,
            zk_session_timeout=args.zk_session_timeout,
            probe_timeout=args.probe_timeout,
            keep=args.keep,
            progress=progress,
        )

    return finish("failover", measure, args.json, LABELS)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
