"""`fencepost bench failover`: how long writes stop when the leader dies or hands over.

Run as ``python -m bench.failover [--json] [--rounds N]`` (or ``fencepost bench
failover``). It starts a private dev cluster (ZooKeeper, 3 bookies, 3 brokers,
ZooKeeper session timeout ``--zk-session-timeout``, by default the broker's own default of
10 s: followers watch the leader directly, so a dead leader's failover does not wait for its
session to expire) in a temporary directory and stops it at the end, whatever happens. While
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
4b. **sigstop**: SIGSTOPs the leader's process group for 5 s, then SIGCONTs it (a paused
   leader: its followers' heartbeats go unanswered for ``leader_timeout_s``); measured the
   same way; the woken leader must step down and follow (``sigstop_stepped_down``).

5. **partition** (only on test hosts, ``--hosts N``, N >= 3): cuts the leader's host
   from every other host and this machine (the process keeps running); measured the
   same way, from the cut. Then the cut is healed and the round waits until the old
   leader has rejoined as a follower and caught up (``rejoin_s``, from the heal).

After the rounds, one **zk_outage** round (:mod:`bench.failover_zk_outage`): ZooKeeper is
SIGKILLed for 30 s under the load and restarted; acknowledgements go on (the leader keeps
committing), ``zk_outage_longest_gap_s`` is the longest gap between them (target 1 s).

Then one **lagging joiner** round: a broker with an empty data dir joins
(it replays the whole history, so it is not in the in-sync set) and the leader is
SIGKILLed at once; an in-sync follower must take over within the kill target
(``lagging_joiner_kill_s``; ``lagging_joiner_led`` must be false).

``--hosts N`` runs the cluster on test hosts (:mod:`devtools.hosts`: ZooKeeper on a
host of its own, one bookie and one broker on each of N hosts, optionally capped at
``--cpu-per-host`` cores each; the producers and probes run on this machine) and adds
the partition round: ``partition_median_s``, ``partition_max_s``,
``partition_rejoin_median_s`` and each round in ``partitions``. Without it the
cluster runs on 127.0.0.1 and the result has the keys it always had. ``--events``
picks some of the events (e.g. ``--events partition`` for the partition rounds only).

Also reported per event: when the new leader was elected and how long its
takeover took (``*_elected_s``, ``*_takeover_s``, from the brokers' logs), when
ZooKeeper's ``leader`` node named it (``*_published_s``), and how long the
producers stalled (from the event to their
first acknowledged call started after it). At the end the acknowledged tasks
are compared with the tasks the leader holds (``lost``/``duplicated``, both
must be 0). The events and their measurement are :mod:`bench.failover_events`,
the load and the watchers :mod:`bench.failover_watch`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import signal
import sys
import time
import uuid
from typing import Callable

from bench.common import BenchError, finish, machine_info, percentile
from bench.devbench import BenchCluster, quiet_logs
from bench.failover_events import (
    elect_other,
    lagging_joiner_round,
    one_event,
    partition_round,
    restart_member,
    sigstop_round,
    wait_caught_up,
)
from bench.failover_watch import LeaderWatch, Producers
from bench.failover_zk_outage import GAP_TARGET_S as ZK_OUTAGE_GAP_TARGET_S
from bench.failover_zk_outage import zk_outage_result, zk_outage_round
from broker.server.config import BrokerConfig

# The brokers' own defaults: the cluster runs with them unless told otherwise.
SESSION_TIMEOUT_S = BrokerConfig.zk_session_timeout_s
LEADER_TIMEOUT_S = BrokerConfig.leader_timeout_s

TARGETS = {
    "kill_median_s": 1.0,
    "kill_max_s": 1.5,
    "graceful_median_s": 0.2,
    "elect_median_s": 0.3,
    "sigstop_median_s": LEADER_TIMEOUT_S + 0.5,
    "lagging_joiner_kill_s": 3.0,
}
# A leader cut off from everything must be replaced within the failover target of a kill.
PARTITION_TARGET_S = 3.0
EVENTS = ("kill", "graceful", "elect", "sigstop", "partition", "zk_outage", "joiner")
EVENT_TARGETS = {
    "kill": ("kill_median_s", "kill_max_s"),
    "graceful": ("graceful_median_s",),
    "elect": ("elect_median_s",),
    "sigstop": ("sigstop_median_s",),
    "joiner": ("lagging_joiner_kill_s",),
}
# One bookie per host: a cut host takes a bookie with it, and the ack quorum (2) needs two more.
MIN_HOSTS = 3
LABELS = {
    "kill_median_s": "SIGKILL leader: first new write, median (s)",
    "kill_max_s": "SIGKILL leader: first new write, max (s)",
    "graceful_median_s": "SIGTERM leader: first new write, median (s)",
    "graceful_max_s": "SIGTERM leader: first new write, max (s)",
    "elect_median_s": "admin elect: first new write, median (s)",
    "sigstop_median_s": "SIGSTOP leader 5 s: first new write, median (s)",
    "lagging_joiner_kill_s": "SIGKILL leader with a lagging joiner: first new write (s)",
    "partition_median_s": "leader's host cut off: first new write, median (s)",
    "partition_max_s": "leader's host cut off: first new write, max (s)",
    "zk_outage_longest_gap_s": "ZooKeeper down 30 s: longest gap between acknowledgements (s)",
}


def chosen_events(events: list[str] | None, hosts: int) -> tuple[str, ...]:
    """The events to run, in their order: ``events`` (None: all, the partition only on test hosts)."""
    if hosts and hosts < MIN_HOSTS:
        raise BenchError(f"--hosts needs at least {MIN_HOSTS} (one bookie per host; a cut takes one away)")
    if events is None:
        return tuple(e for e in EVENTS if e != "partition" or hosts)
    unknown = sorted(set(events) - set(EVENTS))
    if unknown or not events:
        raise BenchError(f"--events takes some of {','.join(EVENTS)}, not {','.join(unknown) or 'none'}")
    if "partition" in events and not hosts:
        raise BenchError("the partition event cuts a host off: it needs --hosts N")
    return tuple(e for e in EVENTS if e in events)


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
    zk_session_timeout: float = SESSION_TIMEOUT_S,
    probe_timeout: float = 0.5,
    settle_s: float = 1.0,
    keep: bool = False,
    progress: Callable[[str], None] | None = None,
    hosts: int = 0,
    cpu_per_host: float | None = None,
    events: list[str] | None = None,
) -> dict:
    """Run the benchmark (see the module docstring); return the result dict."""
    progress = progress or (lambda _msg: None)
    if rounds < 1 or producers < 0 or not 1 <= batch <= 1000:
        raise BenchError("need rounds >= 1, producers >= 0, 1 <= batch <= 1000")
    chosen = chosen_events(events, hosts)
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    queue = f"failover-{uuid.uuid4().hex[:8]}"
    kills: list[dict] = []
    graceful: list[dict] = []
    elects: list[dict] = []
    sigstops: list[dict] = []
    elect_errors: list[str] = []
    partitions: list[dict] = []
    catch_up: list[float] = []
    joiner: dict = {}
    zk_outage: dict = {}
    with BenchCluster(
        zk_session_timeout=zk_session_timeout,
        keep=keep,
        progress=progress,
        hosts=hosts,
        cpu_per_host=cpu_per_host,
    ) as bc:
        run_dir = str(bc.run_dir)
        prod = Producers(bc, queue, producers, batch)
        watch = LeaderWatch(bc)
        try:
            prod.start()
            time.sleep(settle_s)
            for r in range(rounds):
                for event, sig, results in (
                    ("kill", signal.SIGKILL, kills),
                    ("graceful", signal.SIGTERM, graceful),
                ):
                    if event not in chosen:
                        continue
                    out, member = one_event(bc, prod, watch, queue, sig, probe_timeout, progress)
                    out["round"] = r + 1
                    results.append(out)
                    member = restart_member(bc, member)
                    catch_up.append(round(wait_caught_up(bc, member), 3))
                    time.sleep(settle_s)  # steady load again before the next event
                if "elect" in chosen:
                    out, _ = one_event(
                        bc, prod, watch, queue, 0, probe_timeout, progress, act=elect_other(bc, elect_errors)
                    )
                    out["round"] = r + 1
                    elects.append(out)
                    time.sleep(settle_s)
                if "sigstop" in chosen:
                    out = sigstop_round(bc, prod, watch, queue, probe_timeout, progress)
                    out["round"] = r + 1
                    sigstops.append(out)
                    time.sleep(settle_s)
                if "partition" in chosen:
                    out = partition_round(bc, prod, watch, queue, probe_timeout, progress)
                    out["round"] = r + 1
                    partitions.append(out)
                    time.sleep(settle_s)
            if "zk_outage" in chosen:
                zk_outage = zk_outage_round(bc, prod, progress)
            if "joiner" in chosen:
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
        "sigstop_median_s": _median([s["first_write_s"] for s in sigstops]),
        "sigstop_max_s": _max([s["first_write_s"] for s in sigstops]),
        "sigstop_stepped_down": all(s["stepped_down"] for s in sigstops) if sigstops else None,
        "lagging_joiner_kill_s": joiner.get("first_write_s"),
        "lagging_joiner_lag": joiner.get("joiner_lag"),
        "lagging_joiner_led": joiner.get("joiner_led"),
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
        "leader_timeout_s": LEADER_TIMEOUT_S,
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
        "sigstops": sigstops,
        "elect_errors": elect_errors,
        "lagging_joiner": joiner,
        **zk_outage_result(zk_outage),
        **(_on_hosts(hosts, cpu_per_host, partitions) if hosts else {}),
        **({"events": list(chosen)} if events is not None else {}),
        "started_at": started_at,
        "machine": machine_info(),
    }
    if keep:
        result["run_dir"] = run_dir  # broker logs for a closer look (the processes are stopped)
    targets = {key: TARGETS[key] for e in chosen for key in EVENT_TARGETS.get(e, ())}
    if "partition" in chosen:
        targets["partition_median_s"] = PARTITION_TARGET_S
    if "zk_outage" in chosen:
        targets["zk_outage_longest_gap_s"] = ZK_OUTAGE_GAP_TARGET_S
    result["targets"] = targets
    result["targets_met"] = (
        all(result[key] is not None and result[key] <= target for key, target in targets.items())
        and result["lost"] == 0
        and result["duplicated"] == 0
        and not elect_errors
        and not joiner.get("joiner_led")
        and result["sigstop_stepped_down"] is not False
    )
    return result


def _on_hosts(hosts: int, cpu_per_host: float | None, partitions: list[dict]) -> dict:
    """The result's keys of a run on test hosts: where it ran, and the partition rounds."""
    return {
        "hosts": hosts,
        "cpu_per_host": cpu_per_host,
        "load_runs_on": "local (this machine, not CPU-capped; producers and probes reach the hosts over the bridge)",
        "partition_median_s": _median([p["first_write_s"] for p in partitions]),
        "partition_max_s": _max([p["first_write_s"] for p in partitions]),
        "partition_elected_median_s": _median([p.get("elected_s") for p in partitions]),
        "partition_published_median_s": _median([p["published_s"] for p in partitions]),
        "partition_producer_stall_median_s": _median([p["producer_stall_s"] for p in partitions]),
        "partition_rejoin_median_s": _median([p["rejoin_s"] for p in partitions]),
        "partition_cut_median_s": _median([p["cut_s"] for p in partitions]),
        "partitions": partitions,
    }


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
        default=SESSION_TIMEOUT_S,
        help=f"the brokers' ZooKeeper session timeout (default {SESSION_TIMEOUT_S:g} s, the brokers' own)",
    )
    parser.add_argument(
        "--probe-timeout",
        type=float,
        default=0.5,
        help="each probe call's deadline before it starts again (default 0.5 s)",
    )
    parser.add_argument(
        "--hosts",
        type=int,
        default=0,
        help=f"run on N test hosts (N >= {MIN_HOSTS}, root only) and add the partition round (default: none)",
    )
    parser.add_argument(
        "--cpu-per-host",
        type=float,
        default=None,
        help="cap each test host at this many cores (with --hosts)",
    )
    parser.add_argument(
        "--events",
        default=None,
        help=f"comma-separated events to run, of {','.join(EVENTS)} (default: all; partition with --hosts)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run directory (logs) afterwards")
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    args = parser.parse_args(argv)
    if args.cpu_per_host is not None and not args.hosts:
        parser.error("--cpu-per-host needs --hosts")
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
            hosts=args.hosts,
            cpu_per_host=args.cpu_per_host,
            events=args.events.split(",") if args.events is not None else None,
        )

    return finish("failover", measure, args.json, LABELS)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
