"""The fuzzed wire (issue 16): 20,000 hostile messages to a live leader and 20,000 to a live bookie.

Hypothesis-drawn requests (envelope and fields of every op) and the seeded byte
mutations of valid frames, with extra ZeroMQ parts now and then. Every message
gets exactly one reply, correctly addressed, never ``internal``; no process
dies; afterwards the leader serves a submit/lease/complete round and the bookie
an add/read, and the ledger the leader writes is neither fenced nor stalled.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from devtools.fuzz_mutate import mutation_messages
from devtools.fuzz_send import dealer, send_messages
from devtools.fuzz_strategies import hypothesis_messages
from devtools.fuzz_targets import BOOKIE, BROKER, FUZZ_LEDGER_BASE, FUZZ_LEDGERS, Target, entry_bytes
from election import wire
from ledger.log import read_log
from tests.support.harness import call

pytestmark = pytest.mark.integration

FRAMES = 20_000
# Hypothesis draws about two hundred messages a second: some hundreds per target, the rest from the fast corpus.
EXAMPLES = 600
SEED = 16


def _corpus(target: Target) -> list[list[bytes]]:
    drawn = hypothesis_messages(target, EXAMPLES, seed=SEED)
    return drawn + mutation_messages(target, random.Random(SEED), FRAMES - len(drawn))


@pytest.fixture
def corpora():
    """Both targets' messages, drawn in a thread while the cluster starts."""
    with ThreadPoolExecutor(1) as pool:
        yield {
            name: pool.submit(_corpus, target) for name, target in (("broker", BROKER), ("bookie", BOOKIE))
        }


def _fuzz(address: str, future: Future) -> dict:
    messages = future.result(timeout=90)
    assert len(messages) == FRAMES
    started = time.monotonic()
    report = send_messages(lambda: dealer(address), messages, timeout_s=5.0)
    elapsed = time.monotonic() - started
    print(f"fuzz {address}: {FRAMES} messages in {elapsed:.1f}s: {dict(report.replies)}")
    assert report.ok(), report.as_dict()
    assert report.sent == FRAMES and sum(report.replies.values()) == FRAMES, report.as_dict()
    return report.replies


@pytest.mark.timeout(150)
# Hypothesis draws in a thread while the cluster's own threads use the random module: not a strategy's doing.
@pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")
def test_a_fuzzed_leader_and_bookie_answer_every_message_and_keep_serving(corpora, broker_cluster):
    bc = broker_cluster
    leader = bc.wait_leader()
    bookie = bc.bookies[0]
    cluster_ledger = read_log(bc.cluster.zk, bc.cluster.paths)[0][-1]["id"]
    assert cluster_ledger < FUZZ_LEDGER_BASE
    before = call(bookie.address, "read_lac", ledger=cluster_ledger)

    broker_replies = _fuzz(leader["address"], corpora["broker"])
    assert broker_replies["ok"] > 1000 and broker_replies["bad_request"] > 1000, broker_replies
    bookie_replies = _fuzz(bookie.address, corpora["bookie"])
    assert bookie_replies["ok"] > 1000 and bookie_replies["bad_request"] > 1000, bookie_replies

    for proc in bc.brokers + bc.bookies:
        assert proc.alive(), proc.output()[-3000:]
    assert bc.wait_leader()["epoch"] == leader["epoch"]
    assert call(leader["address"], "status")["counters"]["internal_errors"] == 0

    # The leader still serves a whole round, written through the bookies.
    address = leader["address"]
    task_id = call(address, "submit", queue="after-fuzz", payload=b"still here")["task_id"]
    leased = call(address, "lease", worker="checker", queues=["after-fuzz"], wait_ms=0)["tasks"]
    assert [t["task_id"] for t in leased] == [task_id]
    assert call(address, "complete", task_id=task_id, attempt=leased[0]["attempt"], result=b"done")["ok"]
    assert call(address, "get", task_id=task_id)["task"]["state"] == "done"

    # The bookie stores and serves a ledger of this test's own; the cluster's ledger was never touched.
    own = FUZZ_LEDGER_BASE + FUZZ_LEDGERS + 1
    assert call(bookie.address, "add", ledger=own, entry=0, data=entry_bytes(own, 0))["ok"]
    assert call(bookie.address, "read", ledger=own, entry=0)["data"] == entry_bytes(own, 0)
    after = call(bookie.address, "read_lac", ledger=cluster_ledger)
    assert after["ok"] and not after["fenced"] and after["last_entry"] >= before["last_entry"], (
        before,
        after,
    )
    assert read_log(bc.cluster.zk, bc.cluster.paths)[0][-1]["id"] == cluster_ledger


@pytest.mark.timeout(60)
def test_what_the_fuzzer_found_on_a_bookie_is_refused_or_served(cluster, procs, client_for):
    """Each used to be answered ``internal``: a request without an id, a wait_lac with 'after' below -1,
    a value nested deeper than Python's repr recurses."""
    bookie = client_for(procs.start_bookie(cluster).address)
    ledger = FUZZ_LEDGER_BASE
    for op, fields in (
        ("add", {"ledger": ledger, "entry": 0, "data": entry_bytes(ledger, 0)}),
        ("add", {"ledger": ledger, "entry": 0, "data": b"\x00" * 40}),
        ("wait_lac", {"ledger": ledger, "after": 0, "timeout_ms": 0}),
    ):
        bookie.send_raw(wire.encode({"v": wire.PROTOCOL_VERSION, "op": op, **fields}))
        reply = bookie.recv(timeout_ms=5000)
        assert reply["rid"] is None and reply.get("error") != "internal", reply
    reply = bookie.call("wait_lac", ledger=ledger, after=-(1 << 63) + 1, timeout_ms=0, max_entries=4)
    assert reply["error"] == "bad_request", reply
    # Values nested deeper than Python's repr recurses, quoted in the error message.
    nested = b"\x81\xa1a" * 1020 + b"\x01"
    for frame, code in (
        (b"\x83\xa1v" + nested + b"\xa2op\xa4ping\xa3rid\x07", "wrong_version"),
        (b"\x84\xa1v\x01\xa2op\xa4ping\xa3rid\x07\xa6bookie" + nested, "wrong_bookie"),
    ):
        bookie.send_raw(frame)
        reply = bookie.recv(timeout_ms=5000)
        assert reply["rid"] == 7 and reply["error"] == code, reply
    assert bookie.call("read", ledger=ledger, entry=0)["data"] == entry_bytes(ledger, 0)
