"""20,000 hostile frames against a live leader: every one answered, no broker dies, nothing internal."""
from __future__ import annotations

import random
import time

import pytest

from devtools.fuzz import NO_REPLY, fuzz_frames, send_frames
from tests.conftest import call

pytestmark = pytest.mark.integration

FRAMES = 20_000


@pytest.mark.timeout(120)
def test_a_fuzzed_leader_answers_every_frame_and_keeps_leading(broker_cluster):
    bc = broker_cluster
    leader = bc.wait_leader()
    frames = fuzz_frames(random.Random(20_000), FRAMES)
    started = time.monotonic()
    counts = send_frames(leader["address"], frames, timeout_s=5.0)
    elapsed = time.monotonic() - started
    assert counts.get(NO_REPLY, 0) == 0, counts
    assert sum(counts.values()) == FRAMES, counts
    # The request checks stop every hostile request; the safety net is never needed.
    assert counts.get("internal", 0) == 0, counts
    assert counts.get("ok", 0) > 1000 and counts.get("bad_request", 0) > 1000, counts
    for proc in bc.brokers:
        assert proc.alive(), proc.output()[-3000:]
    assert bc.wait_leader()["epoch"] == leader["epoch"]
    assert call(leader["address"], "submit", queue="after-fuzz", payload=b"ok")["ok"]
    status = call(leader["address"], "status")
    assert status["counters"]["internal_errors"] == 0
    print(f"fuzz: {FRAMES} frames in {elapsed:.1f}s ({FRAMES / elapsed:.0f}/s): {counts}")
