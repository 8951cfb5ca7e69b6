"""The replicated broker serves, redirects, and refuses bad input while it keeps serving."""

import time

import pytest
import zmq

from election import wire
from tests.support.harness import call

pytestmark = pytest.mark.integration


def _raw(address, frame, timeout=5.0):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
    try:
        sock.connect(address)
        sock.send(frame)
        return wire.decode(sock.recv())
    finally:
        sock.close()


def test_submit_lease_complete_and_followers_redirect(broker_cluster):
    leader = broker_cluster.wait_leader()
    sub = call(leader["address"], "submit", queue="mail", payload=b"hi", key="k1")
    assert sub["ok"], sub
    again = call(leader["address"], "submit", queue="mail", payload=b"hi", key="k1")
    assert again["task_id"] == sub["task_id"]
    lease = call(leader["address"], "lease", worker="w", queues=["mail"], max_tasks=2)
    assert [t["task_id"] for t in lease["tasks"]] == [sub["task_id"]]
    task = lease["tasks"][0]
    done = call(leader["address"], "complete", task_id=task["task_id"], attempt=task["attempt"], result=b"r")
    assert done["ok"], done
    got = call(leader["address"], "get", task_id=sub["task_id"])["task"]
    assert got["state"] == "done" and got["result"] == b"r" and got["attempts"] == 1
    followers = [p for p in broker_cluster.brokers if p.address != leader["address"]]
    deadline = time.monotonic() + 10
    while True:
        reply = call(followers[0].address, "submit", queue="mail", payload=b"x")
        if reply.get("leader") or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert reply["error"] == "not_leader" and reply["leader"] == leader["address"]


def test_bad_input_gets_clear_errors_and_the_broker_keeps_serving(broker_cluster):
    address = broker_cluster.wait_leader()["address"]
    cases = [
        (b"\x00garbage\xff", "malformed"),
        (wire.encode({"v": 7, "op": "ping", "rid": 1}), "wrong_version"),
        (wire.encode(wire.request("explode", 1)), "unknown_op"),
        (wire.encode(wire.request("submit", 1, queue="bad queue!", payload=b"x")), "invalid_queue"),
        (
            wire.encode(wire.request("submit", 1, queue="q", payload=b"x" * (1024 * 1024 + 1))),
            "payload_too_large",
        ),
        (wire.encode(wire.request("submit", 1, queue="q", payload="not bytes")), "bad_request"),
        (wire.encode(wire.request("lease", 1, worker="w", queues="q")), "bad_request"),
        # Over max_frame_bytes (8 MiB): refused with the rid, so a client can match the refusal.
        (
            wire.encode(wire.request("submit", 1, queue="q", payload=b"x" * (8 * 1024 * 1024))),
            "payload_too_large",
        ),
    ]  # a frame over twice max_frame_bytes gets no reply: the socket drops it (tests/integration/test_poison_requests.py)
    for frame, code in cases:
        reply = _raw(address, frame)
        assert reply["ok"] is False and reply["error"] == code, (code, reply)
        assert reply["message"] and reply["rid"] == (None if code == "malformed" else 1), reply
    ok = call(address, "submit", queue="q", payload=b"still serving")
    assert ok["ok"], ok
    status = call(address, "status")
    assert status["counters"]["bad_requests"] >= len(cases)


def test_status_json_names_leader_epoch_and_brokers(broker_cluster, procs):
    bc = broker_cluster
    leader = bc.wait_leader()
    assert call(leader["address"], "submit", queue="jobs", payload=b"x")["ok"]
    target = ["--zk", bc.zk_hosts, "--cluster", bc.cluster.name]
    deadline = time.monotonic() + 15
    while True:
        result = procs.run(["status", "--json", *target])
        assert result.returncode == 0, result.stderr.decode()
        view = __import__("json").loads(result.stdout)
        if len(view["brokers"]) == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert view["leader"] == leader["broker_id"] and view["epoch"] == leader["epoch"]
    roles = sorted(b["role"] for b in view["brokers"])
    assert roles == ["follower", "follower", "leader"]
    for b in view["brokers"]:
        assert {"id", "role", "address", "position", "digest"} <= set(b)
    assert view["queues"]["jobs"]["waiting"] == 1
    assert view["leader_zookeeper"]["connected"] is True  # the leader's own view of its session
    assert len(view["bookies"]) == 3 and view["ledgers"]
    human = procs.run(["status", *target])
    assert "leader:" in human.stdout.decode() and "jobs" in human.stdout.decode()


def test_leader_rolls_to_new_ledgers_in_the_same_epoch(cluster, procs):
    procs.start_bookies(cluster, 3)
    brokers = procs.start_brokers(cluster, 2, extra=["--ledger-max-entries", "5"])
    from tests.support.harness import BrokerCluster

    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=[], brokers=brokers)
    leader = bc.wait_leader()
    ids = [
        call(leader["address"], "submit", queue="roll", payload=b"%d" % i, key=f"k{i}")["task_id"]
        for i in range(30)
    ]
    from ledger.log import read_log

    ledgers, _ = read_log(cluster.zk, cluster.paths)
    assert len(ledgers) >= 5 and {x["epoch"] for x in ledgers} == {leader["epoch"]}
    status = call(leader["address"], "status")
    assert status["queues"]["roll"]["waiting"] == 30
    follower = next(p for p in brokers if p.address != leader["address"])
    deadline = time.monotonic() + 15
    while call(follower.address, "status")["position"] != status["position"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert call(follower.address, "status")["digest"] == status["digest"]
    assert len(set(ids)) == 30
