"""`fencepost bench catchup`: how fast a joining broker catches up (log replay, snapshots).

Run as ``python -m bench.catchup [--json] [--tasks N] [--replay-events N]`` (or
``fencepost bench catchup``). Two parts, one run:

1. **Replay** (what a follower or a new leader does with history it lacks).
   Unless ``--zk``/``--cluster`` name an existing cluster, a private ZooKeeper
   and three bookies (fsync on) are started in a temporary directory and stopped
   at the end, whatever happens. History is written the way the leader writes
   it: one ledger per epoch (ensemble 3, write quorum 3, ack quorum 2), appended
   to the log with a CAS, starting with an ``EpochStarted`` entry, then entries
   of ``events_per_entry`` ``TaskSubmitted`` events encoded with
   :func:`broker.state.events.encode_batch` (time stamped by the writer, ~100-byte
   payloads, time-ordered task ids as the leader makes them), a ``StateDigest`` at the head of every 200th entry
   (the broker's ``digest_every_entries``) computed from a leader-side store
   that applies each batch as the leader does. The last ledger stays OPEN, as
   the current leader's would. Then a fresh :class:`~ledger.client.facade.LedgerClient`
   (its own bookie pool) and an empty :class:`~broker.state.store.StateStore`
   with its default settings (fsync on) run :func:`broker.server.store.follower.catch_up`,
   the follower's own code; events/s and entries/s are measured around it.
   Thin wrappers around the log reader and the store split that time into
   reading (``LogReader.poll``: bookie round trips, digest checks), applying
   (``StateStore.apply_batch``: state machine + LMDB commit with fsync) and the
   rest (``decode_batch``: msgpack + event validation). Afterwards the replayed
   store must hold the leader-side store's position and digest.

2. **Snapshots** (what a member too far behind the log does first). A store of
   ``tasks`` waiting tasks (one queue, ~100-byte payloads) is built in process
   (batches of 10,000 ``TaskSubmitted`` events, ``sync=False``), then timed:
   ``SnapshotCatalog.create`` (the checkpoint), the download with
   :func:`snapshots.transfer.download` through the joining broker's own
   requester (:func:`broker.server.store.join.broker_requester`) from a separate server
   process answering ``snapshot_info``/``snapshot_chunk`` on a real ZeroMQ
   ROUTER on 127.0.0.1 (as the broker's request loop does), and
   :func:`broker.state.restore.restore_snapshot` into a new state directory
   (verification, load, digest check). The restored store must have the
   source's position and digest. Before the snapshot, the check a broker runs on its store
   after every start (before it stands for election) is timed on the same store
   (``start_verify_s``).

``--tasks 0`` skips part 2 and ``--replay-events 0`` skips part 1 (their
fields are then null). See docs/benchmarks.md for every output field. Part 1 is
:mod:`bench.catchup_replay` (the history written by :mod:`bench.leader_history`),
part 2 :mod:`bench.catchup_snapshot`, the tasks and stores of both
:mod:`bench.catchup_workload`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from bench.catchup_replay import ACK_QUORUM, ENSEMBLE, WRITE_QUORUM, replay_phase
from bench.catchup_snapshot import snapshot_phase
from bench.common import BenchError, finish_or_fail, machine_info
from bench.devbench import BenchCluster

EVENTS_PER_ENTRY = 200  # TaskSubmitted events per ledger entry in the replayed history
# The goals for a joining broker (replay of the default history; restore of 1,000,000 tasks).
TARGETS = {"replay_events_per_s": 150_000, "snapshot_restore_s": 6.0}

LABELS = {
    "replay_events_per_s": "replay: events/s",
    "replay_entries_per_s": "replay: entries/s",
    "replay_s": "replay: time (s)",
    "replay_read_s": "replay: reading from bookies (s)",
    "replay_apply_s": "replay: applying to LMDB (s)",
    "replay_decode_s": "replay: decode + validate (s)",
    "replay_cpu_us_per_event": "replay: CPU of the replaying process (us/event)",
    "replay_apply_cpu_us_per_event": "replay: CPU in apply (us/event)",
    "replay_bookie_cpu_us_per_event": "replay: CPU of the bookies (us/event)",
    "snapshot_build_s": "snapshot: building the store (s)",
    "snapshot_create_s": "snapshot: create (s)",
    "snapshot_transfer_s": "snapshot: download over ZeroMQ (s)",
    "snapshot_restore_s": "snapshot: restore (s)",
    "snapshot_restore_cpu_s": "snapshot: restore CPU (s)",
    "snapshot_bytes": "snapshot: file bytes",
    "snapshot_records": "snapshot: records",
    "start_verify_s": "store check after a broker's start (s)",
}


def run(
    tasks: int = 1_000_000,
    replay_entries: int = 1_000,
    zk: str | None = None,
    cluster: str | None = None,
    events_per_entry: int = EVENTS_PER_ENTRY,
    replay_ledgers: int = 2,
    replay_events: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run both parts; return the result dict (see docs/benchmarks.md).

    ``replay_entries`` TaskSubmitted entries of ``events_per_entry`` events each are
    replayed (plus one EpochStarted entry per ledger); ``replay_events``, if given,
    overrides it with ``ceil(replay_events / events_per_entry)`` entries. ``tasks``
    is the size of the snapshotted store. Zero skips a part. With ``zk`` and
    ``cluster`` the replay uses that cluster's bookies, a private log znode and
    deletes what it wrote; otherwise a private ZooKeeper and three bookies run in
    a temporary directory.
    """
    if replay_events is not None:
        replay_entries = -(-replay_events // events_per_entry) if replay_events > 0 else 0
    if tasks < 0 or replay_entries < 0 or events_per_entry < 1 or replay_ledgers < 1:
        raise BenchError(
            "need tasks >= 0, replay entries >= 0, events_per_entry >= 1 and replay_ledgers >= 1"
        )
    if (zk is None) != (cluster is None):
        raise BenchError("give both --zk and --cluster to use an existing cluster, or neither")
    progress = progress or (lambda _msg: None)
    started = time.time()
    result: dict = {"benchmark": "catchup"}
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="fencepost-catchup-"))
    try:
        replay: dict = {}
        if replay_entries:
            ledgers = min(replay_ledgers, replay_entries)
            if zk is None:
                with BenchCluster(bookies=ENSEMBLE, brokers=0, progress=progress) as lc:
                    replay = replay_phase(
                        lc.zk,
                        lc.cluster,
                        replay_entries,
                        ledgers,
                        events_per_entry,
                        work,
                        private=True,
                        progress=progress,
                        bookie_pids=lc.bookie_pids,
                    )
                    replay["bookie_pids"] = lc.bookie_pids
            else:
                replay = replay_phase(
                    zk,
                    cluster,
                    replay_entries,
                    ledgers,
                    events_per_entry,
                    work,
                    private=False,
                    progress=progress,
                )
            shutil.rmtree(work / "leader-state", ignore_errors=True)
            shutil.rmtree(work / "replay-state", ignore_errors=True)
        snap: dict = {}
        if tasks:
            snap = snapshot_phase(tasks, cluster or "bench-catchup", work, progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    result["replay_events_per_s"] = replay.get("replay_events_per_s")
    result["replay_entries_per_s"] = replay.get("replay_entries_per_s")
    result["snapshot_create_s"] = snap.get("snapshot_create_s")
    result["snapshot_transfer_s"] = snap.get("snapshot_transfer_s")
    result["snapshot_restore_s"] = snap.get("snapshot_restore_s")
    result["snapshot_bytes"] = snap.get("snapshot_bytes")
    result["tasks"] = tasks
    result.update({k: v for k, v in replay.items() if k not in result and k != "bookie_pids"})
    result.update({k: v for k, v in snap.items() if k not in result})
    result["fsync"] = {
        "bookies": True if zk is None else None,
        "replay_store": True,
        "snapshot_source_store": False,
        "restored_store": True,
    }
    result["ensemble"], result["write_quorum"], result["ack_quorum"] = ENSEMBLE, WRITE_QUORUM, ACK_QUORUM
    result["bookies"] = "private" if zk is None else f"cluster {cluster}"
    result["started_at"] = datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(
        timespec="seconds"
    )
    result["machine"] = machine_info()
    # The machine may be shared: the load average (1, 5, 15 min) when the run began and ended.
    result["load_average"] = {
        "start": [round(x, 2) for x in load_before],
        "end": [round(x, 2) for x in os.getloadavg()],
    }
    if "bookie_pids" in replay:
        result["bookie_pids"] = replay["bookie_pids"]
    result["targets"] = dict(TARGETS)
    checks_ok = replay.get("replay_digest_ok", True) and snap.get("snapshot_restore_ok", True)
    result["targets_met"] = bool(
        checks_ok
        and (not replay_entries or replay["replay_events_per_s"] >= TARGETS["replay_events_per_s"])
        and (not tasks or snap["snapshot_restore_s"] <= TARGETS["snapshot_restore_s"])
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.catchup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--tasks",
        type=int,
        default=1_000_000,
        help="tasks in the snapshotted store (default 1,000,000; 0 skips the snapshot part)",
    )
    parser.add_argument(
        "--replay-events",
        type=int,
        default=None,
        help="TaskSubmitted events to replay (default 200,000 = 1,000 entries; 0 skips the replay)",
    )
    parser.add_argument(
        "--events-per-entry",
        type=int,
        default=EVENTS_PER_ENTRY,
        help=f"events per ledger entry (default {EVENTS_PER_ENTRY})",
    )
    parser.add_argument(
        "--ledgers", type=int, default=2, help="ledgers (epochs) the history spans (default 2)"
    )
    parser.add_argument(
        "--zk", default=None, help="use this ZooKeeper's cluster's bookies instead of private ones"
    )
    parser.add_argument("--cluster", default=None, help="cluster name (with --zk)")
    args = parser.parse_args(argv)
    say = (lambda msg: print(msg, file=sys.stderr)) if not args.json else None

    replay_events = args.replay_events if args.replay_events is not None else 1_000 * args.events_per_entry

    def measure() -> dict:
        return run(
            tasks=args.tasks,
            zk=args.zk,
            cluster=args.cluster,
            events_per_entry=args.events_per_entry,
            replay_ledgers=args.ledgers,
            replay_events=replay_events,
            progress=say,
        )

    return finish_or_fail("catchup", measure, args.json, LABELS)


if __name__ == "__main__":
    sys.exit(main())
