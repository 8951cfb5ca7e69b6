"""`fencepost bench ledger`: ledger add throughput and latency, against a ZooKeeper baseline.

Run as ``python -m bench.ledger [--json] [--seconds N]`` (or ``fencepost bench
ledger``). Unless ``--zk``/``--cluster`` name an existing cluster, it starts a
private ZooKeeper and five bookies (fsync on, AutoRecovery off; a spare each for
the re-replication and ensemble-change phases) in a temporary directory and stops them at the end, whatever happens. Then, on ledgers with ensemble 3,
write quorum 3, ack quorum 2:

1. **throughput** (``seconds/2``): one pipelined :class:`~ledger.client.writer.LedgerWriter`
   keeps up to ``inflight`` adds of ``entry_size``-byte payloads outstanding;
   entries/s, MB/s (payload bytes, 10^6) and add latency from ``add()`` to the
   completion of its future;
2. **paced** (``seconds/4``): an open-loop producer offers ``offered_rate``
   adds/s on a fixed schedule; latency is measured from each add's *scheduled*
   time, so a stalled producer cannot hide queueing (no coordinated omission);
3. **ZooKeeper baseline** (``seconds/4``): the same payloads written as
   sequential znodes with kazoo's ``create_async``, up to ``inflight``
   outstanding; records/s.
4. **ensemble change** (private cluster only: it kills one of its bookies): paced
   adds on a fresh ledger, one of its bookies SIGKILLed after a second; the
   longest gap between acknowledged adds from the kill until a second after the
   writer swapped the bookie out (``ensemble_change_stall_ms``, target at most
   twice the add timeout).
5. **re-replication** (private cluster only, before phase 4): ~30 MB of closed
   ledgers written, the bookie in most of them SIGKILLed, and
   ``rereplicate_ledger`` timed, unthrottled, for each ledger it held
   (``rereplication_mb_per_s``, ``rereplication_bytes``; bench/rereplication.py).
   The private bookies run without AutoRecovery, so only this phase copies.

The first ~10% of each phase (at most 1 s) is warm-up and is not counted.
See docs/benchmarks.md for every output field. Phases 1-3 are :mod:`bench.ledger_phases`,
phase 4 :mod:`bench.ledger_stall`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import signal
import sys
import threading
import time
import uuid
from collections import deque
from typing import Callable

from bench.common import BenchError, finish_or_fail, latency_summary, machine_info, rate
from bench.devbench import BenchCluster
from bench.ledger_phases import paced_phase, throughput_phase, zk_phase
from bench.ledger_stall import bookie_killer, stall_phase

ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 3, 3, 2
PRIVATE_BOOKIES = ENSEMBLE + 2  # a spare for each phase that kills a bookie (re-replication, ensemble change)
TARGETS = {"entries_per_s": 20_000, "ratio_vs_zk": 5.0, "paced_p99_ms": 10.0}
STALL_TARGET_ADD_TIMEOUTS = 2.0  # ensemble_change_stall_ms <= this many add timeouts

LABELS = {
    "entries_per_s": "throughput (entries/s)",
    "mb_per_s": "throughput (MB/s payload)",
    "p50_ms": "add latency p50 (ms)",
    "p99_ms": "add latency p99 (ms)",
    "paced_rate": "paced: achieved rate (entries/s)",
    "paced_offered_rate": "paced: offered rate (entries/s)",
    "paced_p50_ms": "paced: latency p50 (ms)",
    "paced_p99_ms": "paced: latency p99 (ms)",
    "client_cpu_us_per_entry": "client process CPU per entry, throughput phase (us)",
    "fsyncs_per_add": "journal fsyncs per stored entry (all bookies)",
    "journal_group_size": "journal records (add requests) per fsync",
    "zk_baseline_per_s": "ZooKeeper baseline (records/s)",
    "ratio_vs_zk": "ledger / ZooKeeper",
    "ensemble_change_stall_ms": "bookie killed: longest gap between acks (ms)",
    "ensemble_change_after_s": "bookie killed: swapped out after (s)",
    "rereplication_mb_per_s": "lost bookie re-replicated (MB/s, unthrottled)",
    "rereplication_bytes": "lost bookie re-replicated (bytes)",
}


def _delete_tree_async(zk, base_path: str, inflight: int = 1000) -> None:
    """Remove the baseline's znodes (only needed on a shared ZooKeeper), pipelined."""
    from kazoo.exceptions import NoNodeError

    try:
        children = zk.get_children(base_path)
    except NoNodeError:
        return
    pending: deque = deque()
    for child in children:
        pending.append(zk.delete_async(f"{base_path}/{child}"))
        if len(pending) >= inflight:
            pending.popleft().wait(30)
    for res in pending:
        res.wait(30)
    try:
        zk.delete(base_path)
        zk.delete(base_path.rsplit("/", 1)[0])  # the shared parent, if now empty
    except Exception:
        pass


def journal_counts(zk, paths) -> dict:
    """The summed journal counters of the registered bookies (their ``stats`` op); zeros if none answers."""
    import json

    from election.wire.exchange import exchange

    total = {"journal_syncs": 0, "journal_records": 0, "adds": 0}
    for bookie in zk.get_children(paths.bookies):
        try:
            address = json.loads(zk.get(paths.bookie(bookie))[0])["address"]
            stats = exchange(address, "stats", timeout=2.0)
        except Exception:
            continue  # gone meanwhile: its share is left out
        for key in total:
            total[key] += stats.get(key, 0)
    return total


def journal_delta(before: dict, after: dict) -> dict:
    """``fsyncs_per_add`` (journal syncs per stored entry, all bookies) and ``journal_group_size``
    (journal records, i.e. add requests, per sync) over a phase."""
    syncs = after["journal_syncs"] - before["journal_syncs"]
    adds = after["adds"] - before["adds"]
    records = after["journal_records"] - before["journal_records"]
    return {
        "fsyncs_per_add": round(syncs / adds, 4) if adds else None,
        "journal_group_size": round(records / syncs, 2) if syncs else None,
    }


def _check(stop: threading.Event) -> None:
    if stop.is_set():
        raise KeyboardInterrupt


def _discard_ledger(client, writer, progress: Callable[[str], None]) -> None:
    """Close (if a phase failed before doing so) and delete one of the benchmark's ledgers."""
    try:
        writer.close(timeout=10.0)
    except Exception:
        pass  # a broken writer still leaves a ledger to delete
    try:
        client.delete(writer.ledger_id)
    except Exception:
        try:
            client.delete(writer.ledger_id, force=True)  # ours, never read: drop it even if not CLOSED
        except Exception as exc:
            progress(f"could not delete benchmark ledger {writer.ledger_id}: {exc}")


# ------------------------------------------------------------------ the benchmark


def run(
    seconds: float = 10.0,
    entry_size: int = 100,
    zk: str | None = None,
    cluster: str | None = None,
    offered_rate: float = 2000.0,
    inflight: int = 1000,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run the phases; return the result dict (see docs/benchmarks.md).

    With ``zk`` and ``cluster`` the bookies registered in that cluster are used
    (at least three must be live) and the ledgers and znodes written are
    deleted afterwards; otherwise a private ZooKeeper and five bookies are
    started in a temporary directory and stopped at the end.
    """
    if seconds <= 0 or entry_size < 0 or offered_rate <= 0 or inflight < 1:
        raise BenchError("need seconds > 0, entry_size >= 0, offered_rate > 0 and inflight >= 1")
    if (zk is None) != (cluster is None):
        raise BenchError("give both --zk and --cluster to use an existing cluster, or neither")
    progress = progress or (lambda _msg: None)
    with _interruptible() as stop:
        if zk is None:
            with BenchCluster(
                bookies=PRIVATE_BOOKIES, brokers=0, progress=progress, bookie_args=("--no-autorecovery",)
            ) as lc:
                pids = lc.bookie_pids  # before the kill: every bookie the run had
                result = _run_phases(
                    lc.zk,
                    lc.cluster,
                    seconds,
                    entry_size,
                    offered_rate,
                    inflight,
                    private=True,
                    progress=progress,
                    stop=stop,
                    kill_bookie=bookie_killer(lc.members("bookie")),
                )
                result["bookie_pids"] = pids
            return result
        return _run_phases(
            zk,
            cluster,
            seconds,
            entry_size,
            offered_rate,
            inflight,
            private=False,
            progress=progress,
            stop=stop,
        )


@contextlib.contextmanager
def _interruptible():
    """Turn the first Ctrl-C into a stop request that the phases obey, then KeyboardInterrupt.

    A KeyboardInterrupt raised at a random point would often land inside a
    future's done-callback, where ``concurrent.futures`` logs and swallows it.
    So the first SIGINT only sets the event; the phase loops stop, the
    outstanding adds drain, and KeyboardInterrupt is raised from the main loop
    (the cluster is then stopped by the ``with`` blocks). A second Ctrl-C
    interrupts at once.
    """
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_sigint(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def _run_phases(
    hosts: str,
    cluster: str,
    seconds: float,
    entry_size: int,
    offered_rate: float,
    inflight: int,
    private: bool,
    progress: Callable[[str], None],
    stop: threading.Event,
    kill_bookie: Callable[[dict], None] | None = None,
) -> dict:
    from election.cluster_config import ClusterOptions
    from election.paths import ClusterPaths
    from election.zk import close, connect
    from ledger.client.facade import LedgerClient

    payload = os.urandom(entry_size)
    options = ClusterOptions(write_quorum=WRITE_QUORUM, ack_quorum=ACK_QUORUM, ensemble_size=ENSEMBLE)
    zk = connect(hosts, session_timeout=10.0)
    client = LedgerClient(zk, ClusterPaths(cluster), options=options)
    writers: list = []
    zk_base = f"/fencepost-bench/{uuid.uuid4().hex[:12]}"
    started = time.time()
    try:
        t_phase = seconds / 2
        progress(f"throughput phase: {t_phase:g}s, {inflight} adds in flight")
        writer = client.create(epoch=1)
        writers.append(writer)
        before = journal_counts(zk, ClusterPaths(cluster))
        cpu0 = time.process_time()
        tp = throughput_phase(writer, payload, t_phase, inflight, stop=stop)
        # Every thread of this process: the writer, the bookie pool's I/O thread, the phase's own loop.
        client_cpu_s = time.process_time() - cpu0
        client_entries = writer.last_add_confirmed + 1  # the warm-up's entries too: the CPU covers them
        journal = journal_delta(before, journal_counts(zk, ClusterPaths(cluster)))
        writer.close()
        _check(stop)

        p_phase = seconds / 4
        progress(f"paced phase: {p_phase:g}s at {offered_rate:g} entries/s")
        writer = client.create(epoch=1)
        writers.append(writer)
        pc = paced_phase(writer, payload, p_phase, offered_rate, inflight, stop=stop)
        writer.close()
        _check(stop)

        z_phase = seconds / 4
        progress(f"ZooKeeper baseline: {z_phase:g}s, {inflight} creates in flight")
        zb = zk_phase(zk, zk_base, payload, z_phase, inflight, stop=stop)
        _check(stop)

        rr = None
        if kill_bookie is not None:  # a bookie fewer afterwards: one spare is left for the ensemble change
            from bench.rereplication import rereplication_phase

            progress("re-replication: closed ledgers written, a member killed, re-replicated unthrottled")
            rr = rereplication_phase(client, kill_bookie, stop, progress=progress)
            _check(stop)

        st = None
        if kill_bookie is not None:  # last: the cluster has one bookie fewer afterwards
            progress(
                f"ensemble change: a bookie killed under {offered_rate:g} entries/s "
                f"(add timeout {client.add_timeout:g}s)"
            )
            writer = client.create(epoch=1)
            writers.append(writer)
            st = stall_phase(
                writer, payload, offered_rate, inflight, kill_bookie, client.add_timeout, stop=stop
            )
            writer.close()
            _check(stop)
    finally:
        if not private:  # a shared cluster: leave nothing behind
            for writer in writers:
                _discard_ledger(client, writer, progress)
            _delete_tree_async(zk, zk_base)
        client.close()
        close(zk)

    tp_stats = latency_summary(tp.latencies)
    pc_stats = latency_summary(pc.latencies)
    zb_stats = latency_summary(zb.latencies)
    entries_per_s = rate(tp.completed, tp.end - tp.start)
    zk_per_s = rate(zb.completed, zb.end - zb.start)
    result = {
        "benchmark": "ledger",
        "entries_per_s": entries_per_s,
        "mb_per_s": round(entries_per_s * entry_size / 1e6, 3),
        "p50_ms": tp_stats["p50_ms"],
        "p99_ms": tp_stats["p99_ms"],
        "paced_offered_rate": offered_rate,
        "client_cpu_us_per_entry": round(client_cpu_s / client_entries * 1e6, 2) if client_entries else None,
        "fsyncs_per_add": journal["fsyncs_per_add"],
        "journal_group_size": journal["journal_group_size"],
        "paced_rate": rate(pc.completed, pc.end - pc.start),
        "paced_p50_ms": pc_stats["p50_ms"],
        "paced_p99_ms": pc_stats["p99_ms"],
        "paced_submit_late_p99_ms": latency_summary(pc.late)["p99_ms"],
        "zk_baseline_per_s": zk_per_s,
        "zk_p50_ms": zb_stats["p50_ms"],
        "zk_p99_ms": zb_stats["p99_ms"],
        "ratio_vs_zk": round(entries_per_s / zk_per_s, 2) if zk_per_s else None,
        "entry_bytes": entry_size,
        "seconds": seconds,
        "inflight": inflight,
        "fsync": True if private else None,  # an existing cluster's bookies decide; unknown here
        "ensemble": ENSEMBLE,
        "write_quorum": WRITE_QUORUM,
        "ack_quorum": ACK_QUORUM,
        "bookies": "private" if private else f"cluster {cluster}",
        "errors": tp.errors + pc.errors + zb.errors + (st.errors if st else 0),
        "throughput_latency": tp_stats,
        "paced_latency": pc_stats,
        "zk_latency": zb_stats,
        "ensemble_change_stall_ms": st.longest_gap_ms() if st else None,
        "ensemble_change_after_s": (
            round(st.changed_at - st.killed_at, 2)
            if st and st.changed_at is not None and st.killed_at is not None
            else None
        ),
        "ensemble_change_add_timeout_s": client.add_timeout if st else None,
        "rereplication_mb_per_s": rr["mb_per_s"] if rr else None,
        "rereplication_bytes": rr["bytes"] if rr else None,
        "rereplication_s": rr["seconds"] if rr else None,
        "rereplication_ledgers": rr["ledgers"] if rr else None,
        "started_at": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "machine": machine_info(),
    }
    first_error = tp.first_error or pc.first_error or zb.first_error or (st.first_error if st else None)
    if first_error:
        result["first_error"] = first_error
    result["targets"] = dict(TARGETS)
    stall_ok = True
    if st is not None:
        # Only measured on a private cluster (the benchmark kills one of its own bookies).
        result["targets"]["ensemble_change_stall_ms"] = STALL_TARGET_ADD_TIMEOUTS * client.add_timeout * 1000
        stall = result["ensemble_change_stall_ms"]
        stall_ok = (
            stall is not None
            and st.changed_at is not None
            and stall <= result["targets"]["ensemble_change_stall_ms"]
        )
    result["targets_met"] = bool(
        entries_per_s >= TARGETS["entries_per_s"]
        and (result["ratio_vs_zk"] or 0) >= TARGETS["ratio_vs_zk"]
        and pc_stats["p99_ms"] is not None
        and pc_stats["p99_ms"] < TARGETS["paced_p99_ms"]
        and stall_ok
        and result["errors"] == 0
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--seconds", type=float, default=10.0, help="total measuring time (default 10)")
    parser.add_argument("--entry-size", type=int, default=100, help="payload bytes per entry (default 100)")
    parser.add_argument(
        "--rate", type=float, default=2000.0, help="offered rate of the paced phase (default 2000/s)"
    )
    parser.add_argument("--inflight", type=int, default=1000, help="outstanding adds/creates (default 1000)")
    parser.add_argument("--zk", default=None, help="use this ZooKeeper's cluster instead of a private one")
    parser.add_argument("--cluster", default=None, help="cluster name (with --zk)")
    args = parser.parse_args(argv)
    say = (lambda msg: print(msg, file=sys.stderr)) if not args.json else None

    def measure() -> dict:
        return run(
            seconds=args.seconds,
            entry_size=args.entry_size,
            zk=args.zk,
            cluster=args.cluster,
            offered_rate=args.rate,
            inflight=args.inflight,
            progress=say,
        )

    return finish_or_fail("ledger", measure, args.json, LABELS)


if __name__ == "__main__":
    sys.exit(main())
