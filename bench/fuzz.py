"""Fuzz a live leader with hostile request frames; a request may only fail itself.

Starts a private dev cluster (3 bookies, 3 brokers), sends N frames of the
seeded corpus of :mod:`devtools.fuzz` to the leader in chunks, and checks after
each chunk that the leader process is still alive and still leads the same
epoch. Prints frames sent, replies by code, frames without a reply, leader
crashes (must be 0), brokers that died, and frames per second.

Run: ``fencepost bench fuzz [--frames 20000] [--seed 1] [--json]``.

Example::

    result = run(frames=2000, seed=7)
    assert result["leader_crashes"] == 0
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
from devtools.procs import pid_alive
from devtools.fuzz import NO_REPLY, fuzz_frames, send_frames

CHUNK = 2000
LABELS = {"frames_per_s": "frames/s", "leader_crashes": "leader crashes (target 0)"}


def _leader(bc: BenchCluster) -> tuple[dict, dict]:
    """The leader's node content and its member record (pid, address)."""
    info = bc.leader_info()
    if not info:
        raise BenchError("no leader is published")
    member = next((m for m in bc.members("broker") if m["address"] == info["address"]), None)
    if member is None:
        raise BenchError(f"the leader {info['address']} is not one of this cluster's brokers")
    return info, member


def run(frames: int = 20_000, seed: int = 1, timeout_s: float = 2.0,
        progress: Callable[[str], None] | None = None) -> dict:
    say = progress or (lambda _msg: None)
    corpus = fuzz_frames(random.Random(seed), frames)
    counts: dict[str, int] = {}
    crashes = 0
    with BenchCluster(bookies=3, brokers=3, progress=say) as bc:
        info, member = _leader(bc)
        first_epoch = info["epoch"]
        started = time.monotonic()
        for start in range(0, frames, CHUNK):
            for code, n in send_frames(info["address"], corpus[start:start + CHUNK], timeout_s).items():
                counts[code] = counts.get(code, 0) + n
            if not pid_alive(member["pid"]) or (bc.leader_info() or {}).get("epoch") != info["epoch"]:
                crashes += 1
                say(f"the leader changed after frame {start + CHUNK}: waiting for the next one")
                bc.wait_leader()
                info, member = _leader(bc)
            say(f"{min(start + CHUNK, frames)}/{frames} frames sent")
        elapsed = time.monotonic() - started
        brokers = bc.members("broker")
        dead = sum(1 for m in brokers if not pid_alive(m["pid"]))
        final = bc.leader_info() or {}
    return {
        "frames_sent": frames,
        "seed": seed,
        "replies": dict(sorted((k, v) for k, v in counts.items() if k != NO_REPLY)),
        "no_reply": counts.get(NO_REPLY, 0),
        "leader_crashes": crashes,
        "brokers_dead": dead,
        "epoch_start": first_epoch,
        "epoch_end": final.get("epoch"),
        "seconds": round(elapsed, 2),
        "frames_per_s": rate(frames, elapsed),
        "machine": machine_info(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fencepost bench fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--frames", type=int, default=20_000, help="frames to send (default 20,000)")
    parser.add_argument("--seed", type=int, default=1, help="corpus seed; the same seed sends the same frames")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds without a reply before a frame counts as unanswered")
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    args = parser.parse_args(argv)
    if args.frames < 1:
        parser.error("--frames must be at least 1")
    quiet_logs()
    progress = (lambda msg: print(msg, file=sys.stderr)) if args.verbose else None
    return finish("fuzz", lambda: run(args.frames, args.seed, args.timeout, progress), args.json, LABELS)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
