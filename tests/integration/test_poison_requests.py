"""Requests can only fail themselves (issue 8): poison requests, oversized frames, undecodable entries.

Real ZooKeeper, bookies and brokers. Each poison request of the issue used to
make the leader exit; the next leader then got the client's retry and died the
same way, until no broker was left.
"""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from broker.api.client import Client, ClientError
from broker.api.worker import Worker
from broker.state.events import encode_batch
from election import wire
from election.cluster_config import ClusterOptions, ensure_cluster_config
from election.leader import claim_epoch
from ledger.client.facade import LedgerClient
from ledger.log import append_ledger, read_log
from tests.support.harness import call, wait_for

pytestmark = pytest.mark.integration


def cli_env(bc) -> list[str]:
    return ["--zk", bc.zk_hosts, "--cluster", bc.cluster.name]


def one_line_error(stderr: bytes) -> str:
    """The single ``fencepost: ...`` line (warnings of `python -m cli` aside); no traceback."""
    text = stderr.decode()
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if line.startswith("fencepost: ")]
    assert len(lines) == 1, text
    return lines[0]


def assert_all_serving(bc, epoch: int) -> None:
    """Every broker alive and answering, and the leader is still the one of ``epoch``."""
    for proc in bc.brokers:
        assert proc.alive(), proc.output()[-3000:]
        assert call(proc.address, "ping")["ok"]
    assert bc.wait_leader()["epoch"] == epoch


@pytest.mark.timeout(120)
def test_poison_requests_get_replies_and_every_broker_keeps_serving(broker_cluster, procs):
    bc = broker_cluster
    leader = bc.wait_leader()
    address, epoch = leader["address"], leader["epoch"]

    cancel = call(address, "cancel", task_id="é" * 150)
    assert cancel["ok"] is False and cancel["error"] == "bad_request", cancel
    assert "UTF-8 bytes" in cancel["message"]
    lease = call(address, "lease", worker="w", queues=["m", "m"], max_tasks=None, wait_ms=0)
    assert lease["ok"] is True and lease["tasks"] == [], lease
    for field in ("priority", "delay_ms", "max_attempts", "key"):
        sub = call(address, "submit", queue="nulls", payload=b"x", **{field: None})
        assert sub["ok"] is True, (field, sub)
    assert_all_serving(bc, epoch)

    # The shipped commands of the reproduction.
    done = procs.run(["task", "cancel", "é" * 150, *cli_env(bc)], timeout=60)
    assert done.returncode == 1
    assert "bad_request" in one_line_error(done.stderr)
    worker = procs.start(
        "worker", ["worker", "run", "--queue", "m", "--queue", "m", *cli_env(bc), "--", "cat"]
    )
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=30) as client:
        task_id = client.submit("m", b"from a doubled --queue")
        assert client.wait(task_id, timeout=30)["result"] == b"from a doubled --queue"
        assert worker.alive()

        # The Python API of the reproduction.
        stop = threading.Event()
        api_worker = Worker(
            zk=bc.zk_hosts,
            cluster=bc.cluster.name,
            queues=["pq", "pq"],
            handlers={"pq": lambda task: task.payload.upper()},
        )
        thread = threading.Thread(target=api_worker.run, kwargs={"stop": stop}, daemon=True)
        thread.start()
        try:
            task_id = client.submit("pq", b"shout")
            assert client.wait(task_id, timeout=30)["result"] == b"SHOUT"
        finally:
            stop.set()
            thread.join(15)

        assert_all_serving(bc, epoch)
        normal = client.submit("after", b"normal")
        assert client.get(normal)["state"] == "waiting"


def _raw_send(address: str, frame: bytes, timeout: float) -> dict | None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        sock.send(frame)
        if not sock.poll(int(timeout * 1000), zmq.POLLIN):
            return None
        return wire.decode(sock.recv())
    finally:
        sock.close()


def _peak_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))


@pytest.mark.timeout(120)
def test_an_oversized_frame_is_dropped_before_it_is_received_whole(broker_cluster):
    bc = broker_cluster
    leader_proc = bc.leader_proc()
    before = _peak_rss_kb(leader_proc.pid)
    frame = wire.encode(wire.request("submit", 1, queue="q", payload=b"x" * (64 * 1024 * 1024)))
    assert _raw_send(leader_proc.address, frame, timeout=3.0) is None  # disconnected, never answered
    after = _peak_rss_kb(leader_proc.pid)
    # A frame received whole would have lifted the peak by 64 MiB at least.
    assert after - before < 32 * 1024, (before, after)
    reply = call(leader_proc.address, "submit", queue="q", payload=b"still serving")
    assert reply["ok"], reply
    assert leader_proc.alive()


@pytest.mark.timeout(120)
def test_the_client_refuses_what_a_broker_cannot_take_at_once(broker_cluster, procs):
    bc = broker_cluster
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=30) as client:
        started = time.monotonic()
        with pytest.raises(ClientError) as info:
            client.submit("q", b"x" * (1024 * 1024 + 1))  # over the cluster's max_payload_bytes
        assert info.value.code == "payload_too_large" and "max_payload_bytes=1048576" in info.value.message
        with pytest.raises(ClientError) as info:
            client.complete_many([{"task_id": "t", "attempt": 1, "result": b"r" * (9 * 1024 * 1024)}])
        assert info.value.code == "payload_too_large" and "frame limit" in info.value.message
        assert time.monotonic() - started < 5
        # Many payloads that fit one by one are sent in several frames.
        ids = client.submit_many([{"queue": "big", "payload": bytes([i]) * (900 * 1024)} for i in range(12)])
        assert len(set(ids)) == 12
        assert client.get(ids[-1])["payload"] == bytes([11]) * (900 * 1024)
    started = time.monotonic()
    done = procs.run(["submit", "q", *cli_env(bc)], input=b"y" * (2 * 1024 * 1024), timeout=60)
    assert done.returncode == 1 and time.monotonic() - started < 20
    assert "payload_too_large" in one_line_error(done.stderr)


@pytest.mark.timeout(150)
def test_a_committed_entry_no_broker_can_decode_stops_them_loudly(cluster, procs, free_port):
    """A ledger holding an entry that is not a batch: the catching-up leader and a learner both stop."""
    procs.start_bookies(cluster, 3)
    wait_for(
        lambda: (
            cluster.zk.exists(cluster.paths.bookies)
            and len(cluster.zk.get_children(cluster.paths.bookies)) >= 3
        ),
        20,
        "3 bookies",
    )
    ensure_cluster_config(cluster.zk, cluster.paths, ClusterOptions(), clock=time.time)
    epoch = claim_epoch(cluster.zk, cluster.paths, 0).epoch
    ledgers = LedgerClient(cluster.zk, cluster.paths)
    try:
        writer = ledgers.create(epoch)
        append_ledger(
            cluster.zk, cluster.paths, writer.ledger_id, epoch, read_log(cluster.zk, cluster.paths)[1]
        )
        writer.add_sync(encode_batch([{"type": "EpochStarted", "epoch": epoch, "broker_id": 0, "now_ms": 1}]))
        writer.add_sync(b"\xc1 not a batch")
        writer.close(timeout=5)
    finally:
        ledgers.close()
    bad_position = f"({writer.ledger_id}, 1)"

    def start(name: str, extra: list[str]):
        address = f"tcp://127.0.0.1:{free_port()}"
        return procs.start(
            name,
            [
                "broker",
                "start",
                "--data",
                str(procs.workdir / f"{name}-data"),
                "--listen",
                address,
                "--zk",
                cluster.hosts,
                "--cluster",
                cluster.name,
                "--zk-session-timeout-s",
                "2",
                *extra,
            ],
        )

    learner = start("learner", ["--learner"])
    standing = start("standing", [])
    for proc in (learner, standing):
        assert proc.wait(60) == 1, proc.output()[-3000:]
        critical = [line for line in proc.output().splitlines() if "CRITICAL" in line]
        assert len(critical) == 1, proc.output()[-3000:]
        assert bad_position in critical[0] and "cannot be decoded" in critical[0], critical
        assert "Traceback" not in proc.output()
