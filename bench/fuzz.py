"""Fuzz a live leader and a live bookie with hostile messages; a request may only fail itself.

Starts a private dev cluster (3 bookies, 3 brokers) and sends N messages to
each target (``--target broker``, ``bookie`` or ``both``) in chunks. A broker
chunk mixes the seeded hostile-frame corpus of :mod:`devtools.fuzz`,
Hypothesis-drawn requests (:mod:`devtools.fuzz_strategies`) and byte
mutations of valid frames with extra ZeroMQ parts (:mod:`devtools.fuzz_mutate`);
a bookie chunk the last two, on ledgers the cluster does not use. After each
chunk the target must still be alive (and the leader lead the same epoch); at
the end each target must serve a correct request round (a submit, lease and
complete on the leader; an add and a read on the bookie). Prints, per target,
frames sent, replies by code, frames without a reply, extra replies, replies
with the wrong rid, crashes (target 0), frames per second, and the first
offending messages in hex; the top-level fields sum the targets.

Run: ``fencepost bench fuzz [--frames 20000] [--target broker|bookie|both] [--seed 1] [--json]``.

Example::

    result = run(frames=2000, seed=7, target="both")
    assert result["leader_crashes"] == 0 and result["targets"]["bookie"]["crashes"] == 0
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time
from typing import Callable

from bench.common import BenchError, finish, machine_info, rate
from bench.devbench import BenchCluster, quiet_logs
from devtools.fuzz import fuzz_frames
from devtools.fuzz_mutate import mutation_messages
from devtools.fuzz_send import INTERNAL, FuzzReport, dealer, send_messages
from devtools.fuzz_strategies import hypothesis_messages
from devtools.fuzz_targets import BOOKIE, BROKER, FUZZ_LEDGER_BASE, FUZZ_LEDGERS, Target, entry_bytes
from devtools.procs import pid_alive
from election.wire.exchange import exchange

CHUNK = 2000
# Hypothesis draws a few hundred messages a second: a small share of each chunk, a new seed per chunk.
DRAWN_PER_CHUNK = 50
TARGETS = ("broker", "bookie", "both")
LABELS = {
    "frames_per_s": "frames/s",
    "leader_crashes": "leader crashes (target 0)",
    "bookie_crashes": "bookie crashes (target 0)",
}


def _leader(bc: BenchCluster) -> tuple[dict, dict]:
    """The leader's node content and its member record (pid, address)."""
    info = bc.leader_info()
    if not info:
        raise BenchError("no leader is published")
    member = next((m for m in bc.members("broker") if m["address"] == info["address"]), None)
    if member is None:
        raise BenchError(f"the leader {info['address']} is not one of this cluster's brokers")
    return info, member


def chunk_messages(target: Target, seed: int, index: int, count: int) -> list[list[bytes]]:
    """Chunk ``index`` of a run: the same seed and index always give the same messages."""
    chunk_seed = seed * 1_000_003 + index
    drawn = hypothesis_messages(target, min(DRAWN_PER_CHUNK, count), seed=chunk_seed)
    rest = count - len(drawn)
    legacy = (
        [[frame] for frame in fuzz_frames(random.Random(chunk_seed), rest // 3)] if target is BROKER else []
    )
    return drawn + legacy + mutation_messages(target, random.Random(chunk_seed), rest - len(legacy))


def _broker_serves(address: str) -> bool:
    """A whole submit, lease, complete round on the leader."""
    task_id = exchange(address, "submit", 10.0, queue="after-fuzz", payload=b"ok").get("task_id")
    tasks = (
        exchange(address, "lease", 10.0, worker="bench-fuzz", queues=["after-fuzz"], wait_ms=0).get("tasks")
        or []
    )
    mine = [t for t in tasks if t["task_id"] == task_id]
    return (
        bool(mine)
        and exchange(
            address, "complete", 10.0, task_id=task_id, attempt=mine[0]["attempt"], result=b"done"
        ).get("ok")
        is True
    )


def _bookie_serves(address: str, seed: int) -> bool:
    """An add and a read back on a ledger the fuzzer never names."""
    ledger = FUZZ_LEDGER_BASE + FUZZ_LEDGERS + 1 + seed % 1000
    data = entry_bytes(ledger, 0)
    return (
        exchange(address, "add", 10.0, ledger=ledger, entry=0, data=data).get("ok") is True
        and exchange(address, "read", 10.0, ledger=ledger, entry=0).get("data") == data
    )


def _fuzz_target(
    bc: BenchCluster, target: Target, frames: int, seed: int, timeout_s: float, say: Callable[[str], None]
) -> dict:
    report, crashes, elapsed = FuzzReport(), 0, 0.0
    if target is BROKER:
        info, member = _leader(bc)
    else:
        member = bc.members("bookie")[0]
    for index, start in enumerate(range(0, frames, CHUNK)):
        messages = chunk_messages(target, seed, index, min(CHUNK, frames - start))
        started = time.monotonic()
        report.merge(send_messages(lambda: dealer(member["address"]), messages, timeout_s))
        elapsed += time.monotonic() - started
        if target is BROKER and (
            not pid_alive(member["pid"]) or (bc.leader_info() or {}).get("epoch") != info["epoch"]
        ):
            crashes += 1
            say(f"the leader changed after frame {start + CHUNK}: waiting for the next one")
            bc.wait_leader()
            info, member = _leader(bc)
        elif target is BOOKIE and not pid_alive(member["pid"]):
            crashes += 1
            say(f"bookie {member['address']} died after frame {start + CHUNK}: stopping its run")
            break
        say(f"{target.name}: {min(start + CHUNK, frames)}/{frames} frames sent")
    serves = (
        _broker_serves(member["address"])
        if target is BROKER
        else pid_alive(member["pid"]) and _bookie_serves(member["address"], seed)
    )
    return {
        "frames_sent": report.sent,
        "replies": dict(sorted(report.replies.items())),
        "no_reply": report.no_reply,
        "extra_replies": report.extra_replies,
        "rid_mismatches": report.rid_mismatches,
        "internal": report.replies.get(INTERNAL, 0),
        "crashes": crashes,
        "serves_after": serves,
        "seconds": round(elapsed, 2),
        "frames_per_s": rate(report.sent, elapsed),
        "samples": report.samples,
    }


def run(
    frames: int = 20_000,
    seed: int = 1,
    timeout_s: float = 2.0,
    progress: Callable[[str], None] | None = None,
    target: str = "broker",
) -> dict:
    say = progress or (lambda _msg: None)
    chosen = [BROKER, BOOKIE] if target == "both" else [BROKER if target == "broker" else BOOKIE]
    results: dict[str, dict] = {}
    with BenchCluster(bookies=3, brokers=3, progress=say) as bc:
        first_epoch = (bc.leader_info() or {}).get("epoch")
        for chosen_target in chosen:
            results[chosen_target.name] = _fuzz_target(bc, chosen_target, frames, seed, timeout_s, say)
        dead = sum(1 for m in bc.members("broker") if not pid_alive(m["pid"]))
        bookies_dead = sum(1 for m in bc.members("bookie") if not pid_alive(m["pid"]))
        final = bc.leader_info() or {}
    replies: dict[str, int] = {}
    for result in results.values():
        for code, n in result["replies"].items():
            replies[code] = replies.get(code, 0) + n
    sent = sum(r["frames_sent"] for r in results.values())
    seconds = sum(r["seconds"] for r in results.values())
    return {
        "frames_sent": sent,
        "seed": seed,
        "target": target,
        "replies": dict(sorted(replies.items())),
        "no_reply": sum(r["no_reply"] for r in results.values()),
        "leader_crashes": results.get("broker", {}).get("crashes", 0),
        "bookie_crashes": results.get("bookie", {}).get("crashes", 0),
        "brokers_dead": dead,
        "bookies_dead": bookies_dead,
        "epoch_start": first_epoch,
        "epoch_end": final.get("epoch"),
        "seconds": round(seconds, 2),
        "frames_per_s": rate(sent, seconds),
        "targets": results,
        "machine": machine_info(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fencepost bench fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--frames", type=int, default=20_000, help="frames to send to each target (default 20,000)"
    )
    parser.add_argument(
        "--target",
        choices=TARGETS,
        default="broker",
        help="the leader broker, a bookie (on ledgers the cluster does not use), or both",
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="corpus seed; the same seed sends the same frames"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=2.0,
        help="seconds without a reply before a frame counts as unanswered",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    args = parser.parse_args(argv)
    if args.frames < 1:
        parser.error("--frames must be at least 1")
    quiet_logs()
    progress = (lambda msg: print(msg, file=sys.stderr)) if args.verbose else None
    return finish(
        "fuzz", lambda: run(args.frames, args.seed, args.timeout, progress, args.target), args.json, LABELS
    )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
