"""The leader changes ``bench failover`` causes, and how long each stops writes.

An event is a SIGKILL or a SIGTERM of the leader broker's process group, or an
``admin elect`` of an in-sync follower (:func:`elect_other`). :func:`one_event`
measures it from the event to the first submit of a *probe*, started after the
event, that a leader other than the old one acknowledged (:func:`probe_first_write`
loops short calls), and adds what the watchers saw (:mod:`bench.failover_watch`).
A killed broker is restarted with its recorded command line and waited for until
it has caught up; :func:`lagging_joiner_round` kills the leader while a broker
with an empty data dir replays the whole history. On test hosts,
:func:`partition_round` cuts the leader's host from every other host and this
machine instead (the process lives on), heals the cut and waits until the old
leader has rejoined as a caught-up follower.

:func:`sigstop_round` pauses the leader (SIGSTOP) for 5 s instead and checks that it
follows the new leader once it resumes.

Example::

    out, old_leader = one_event(bc, producers, watch, queue, signal.SIGKILL, 0.5, print)
    wait_caught_up(bc, restart_member(bc, old_leader))
    partition_round(bc, producers, watch, queue, 0.5, print)   # needs BenchCluster(hosts=N)
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

from bench.common import BenchError
from bench.devbench import BenchCluster
from bench.failover_watch import LeaderWatch, Producers, takeover_phases


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


def _broker_id(member: dict) -> int | None:
    from devtools.dev_members import read_broker_id

    return read_broker_id(Path(member["data_dir"]))


def restart_member(bc: BenchCluster, member: dict) -> dict:
    """Start a stopped broker again with its recorded command line (its new pid is recorded in cluster.json)."""
    from devtools.dev_spec import DevClusterError

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


# How long the elect round waits for an in-sync follower to hand leadership to.
IN_SYNC_WAIT_S = 30.0


def signal_leader(sig: int) -> Callable[[dict], tuple[float, float] | None]:
    return lambda leader: os.killpg(leader["pid"], sig)


def elect_other(bc: BenchCluster, errors: list[str]) -> Callable[[dict], tuple[float, float]]:
    """An event that runs ``admin elect`` of an in-sync follower in a thread (the probe runs meanwhile).

    The ZooKeeper session is opened beforehand, as the command has one before it asks.
    """
    from broker.admin.status import elect
    from election.insync import read_insync
    from election.paths import ClusterPaths
    from election.zk import close, connect

    zk = connect(bc.zk, session_timeout=10.0)

    def act(leader: dict) -> tuple[float, float]:
        # A broker restarted by the round before rejoins the set once it reached the leader's position.
        deadline = time.monotonic() + IN_SYNC_WAIT_S
        while True:
            doc, _ = read_insync(zk, ClusterPaths(bc.cluster))
            targets = [m for m in (doc or {}).get("members", []) if m != _broker_id(leader)]
            if targets or time.monotonic() > deadline:
                break
            time.sleep(0.1)
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

        started = time.monotonic(), time.time()  # the event starts with the request, not the wait
        threading.Thread(target=run, daemon=True, name="elect").start()
        return started

    return act


def one_event(
    bc: BenchCluster,
    producers: Producers,
    watch: LeaderWatch,
    queue: str,
    sig: int,
    probe_timeout: float,
    progress: Callable[[str], None],
    act: Callable[[dict], tuple[float, float] | None] | None = None,
    what: str | None = None,
) -> tuple[dict, dict]:
    """Signal the leader with ``sig`` (or run ``act`` on its member record instead, ``what`` naming it
    in the progress line); return the measurements and the leader's member record.

    The times run from the start of the event, or from the (monotonic, wall) time ``act`` returns:
    when an event that takes a while to put in place was whole.
    """
    from broker.api.client import submit_fields
    from devtools.procs import pid_alive

    leader, _followers = bc.leader_and_followers()
    old = leader["address"]
    probe_queue = queue + "-probe"  # probes that time out may still commit: keep them out of the count
    with bc.client(timeout=probe_timeout, request_timeout=min(0.25, probe_timeout)) as probe:
        # The probe is connected and knows the old leader before the event, like any client.
        probe.call("submit", timeout=30.0, **submit_fields(probe_queue, b"warm-up"))
        t_event, t_wall = time.monotonic(), time.time()
        done = (act or signal_leader(sig))(leader)
        if done is not None:
            t_event, t_wall = done
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
    what = what or ("elect" if act is not None else ("SIGKILL" if sig == signal.SIGKILL else "SIGTERM"))
    progress(f"{what} (leader was broker {leader['index']}): {out}")
    return out, leader


def sigstop_round(
    bc: BenchCluster,
    producers: Producers,
    watch: LeaderWatch,
    queue: str,
    probe_timeout: float,
    progress: Callable[[str], None],
    pause_s: float = 5.0,
) -> dict:
    """SIGSTOP the leader's process group for ``pause_s`` (a leader paused, not dead), measured as
    :func:`one_event`; then SIGCONT it and wait until it follows the new leader, caught up
    (``stepped_down``: it no longer leads, ``rejoin_s`` from the SIGCONT)."""
    timer: list[threading.Timer] = []

    def stop(leader: dict) -> None:
        os.killpg(leader["pid"], signal.SIGSTOP)
        resume = threading.Timer(pause_s, lambda: os.killpg(leader["pid"], signal.SIGCONT))
        resume.daemon = True
        timer.append(resume)
        resume.start()

    try:
        out, leader = one_event(bc, producers, watch, queue, 0, probe_timeout, progress, stop, "SIGSTOP")
    finally:
        for resume in timer:
            resume.join()
    resumed = time.monotonic()
    wait_caught_up(bc, leader)
    out["stepped_down"] = (bc.leader_info() or {}).get("address") != leader["address"]
    out["rejoin_s"] = round(time.monotonic() - resumed, 3)
    progress(f"SIGSTOP: broker {leader['index']} resumed and follows in {out['rejoin_s']}s")
    return out


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


def partition_round(
    bc: BenchCluster,
    producers: Producers,
    watch: LeaderWatch,
    queue: str,
    probe_timeout: float,
    progress: Callable[[str], None],
) -> dict:
    """Isolate the leader's host (from every host and this machine), measured as :func:`one_event` from
    the moment the cut is whole (``cut_s``: how long its rules took to put in place, one host after
    another; a write acknowledged meanwhile is the old leader's); then heal and wait until the old
    leader follows the new one, caught up (``rejoin_s``, from the heal).

    A cut leader keeps running; one that exited all the same is started again (``restarted``).
    """
    from devtools.dev_members import member_name
    from devtools.procs import pid_alive

    cut_took: list[float] = []

    def cut(leader: dict) -> tuple[float, float]:
        started = time.monotonic()
        bc.dev.partition([member_name(leader)], None)
        whole = time.monotonic()
        cut_took.append(whole - started)
        return whole, time.time()

    try:
        out, leader = one_event(bc, producers, watch, queue, 0, probe_timeout, progress, cut, "partition")
    finally:
        bc.dev.heal()
    out["cut_s"] = round(cut_took[0], 3) if cut_took else None
    healed = time.monotonic()
    out["restarted"] = not pid_alive(leader["pid"])
    if out["restarted"]:
        leader = restart_member(bc, leader)
    wait_caught_up(bc, leader)
    # A rejoin all the same, but the result should show an old leader that won the next election.
    out["led_again"] = (bc.leader_info() or {}).get("address") == leader["address"]
    out["rejoin_s"] = round(time.monotonic() - healed, 3)
    progress(f"partition healed; broker {leader['index']} rejoined in {out['rejoin_s']}s")
    return out


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)
