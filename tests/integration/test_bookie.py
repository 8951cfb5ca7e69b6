"""A real bookie process, spoken to over a DEALER socket: protocol, durability, fencing, long polls."""

from __future__ import annotations

import json
import time
import uuid

import msgpack
import pytest

from election import wire
from election.paths import ClusterPaths
from tests.support.bookie_client import entry
from tests.support.harness import wait_for

pytestmark = pytest.mark.integration


def test_ping_registration_and_graceful_stop(cluster, procs, client_for):
    bookie = procs.start_bookie(cluster)
    c = client_for(bookie.address)
    reply = c.call("ping")
    config = json.loads(cluster.zk.get(cluster.paths.config)[0])
    assert reply["ok"] and reply["cluster_id"] == config["cluster_id"]
    node = json.loads(cluster.zk.get(cluster.paths.bookie(reply["bookie_id"]))[0])
    assert (
        node["address"] == bookie.address
        and node["bookie_id"] == reply["bookie_id"]
        and node["free_bytes"] > 0
    )
    cookie = json.loads((bookie.data_dir / "COOKIE").read_text())
    instance = cookie.pop("instance_id")
    assert cookie == {
        "cluster": cluster.name,
        "cluster_id": config["cluster_id"],
        "bookie_id": reply["bookie_id"],
    }
    registered = json.loads(cluster.zk.get(f"{cluster.paths.base}/cookies/{reply['bookie_id']}")[0])
    assert registered["instance_id"] == instance
    assert bookie.terminate() == 0
    assert cluster.zk.exists(cluster.paths.bookie(reply["bookie_id"])) is None


def test_bad_frames_get_error_replies_and_the_bookie_keeps_serving(cluster, procs, client_for):
    bookie = procs.start_bookie(cluster)
    c = client_for(bookie.address, timeout_ms=20000)
    good = wire.encode(wire.request("read", 5, ledger=1, entry=0))
    cases = [
        (b"\xc1\xc1 garbage \xff", None, wire.E_MALFORMED),
        (good[:-3], None, wire.E_MALFORMED),
        (msgpack.packb([1, 2, 3]), None, wire.E_MALFORMED),
        # Refused before it is decoded, yet answered with its rid (read from the frame's first bytes).
        (
            wire.encode(wire.request("add", 11, ledger=1, entry=0, data=b"x" * (8 * 1024 * 1024 + 1))),
            11,
            wire.E_OVERSIZED,
        ),
        (wire.encode({"v": 99, "op": "ping", "rid": 12}), 12, wire.E_VERSION),
        (wire.encode({"op": "ping", "rid": 13}), 13, wire.E_VERSION),
        (wire.encode(wire.request("frobnicate", 14)), 14, wire.E_UNKNOWN_OP),
        (wire.encode({"v": 1, "rid": 15}), 15, wire.E_MALFORMED),
        (wire.encode(wire.request("read", 16, ledger="one", entry=0)), 16, wire.E_BAD_REQUEST),
        (wire.encode(wire.request("read", 17, ledger=1, entry=-1)), 17, wire.E_BAD_REQUEST),
        (wire.encode(wire.request("read", 18, ledger=True, entry=0)), 18, wire.E_BAD_REQUEST),
        (wire.encode(wire.request("add", 19, ledger=1, entry=0, data="text")), 19, wire.E_BAD_REQUEST),
        (wire.encode(wire.request("add", 20, ledger=1, entry=0)), 20, wire.E_BAD_REQUEST),
        (wire.encode(wire.request("add", 21, ledger=1.5, entry=0, data=b"")), 21, wire.E_BAD_REQUEST),
        (
            wire.encode(wire.request("wait_lac", 22, ledger=1, after=0, timeout_ms="soon")),
            22,
            wire.E_BAD_REQUEST,
        ),
        (wire.encode(wire.request("wait_lac", 23, ledger=1, after=0, timeout_ms=-5)), 23, wire.E_BAD_REQUEST),
        (wire.encode(wire.request("add", 24, ledger=1, entry=0, data=b"short")), 24, "bad_entry"),
        (wire.encode(wire.request("add", 25, ledger=1, entry=0, data=entry(1, 1))), 25, "bad_entry"),
        (wire.encode(wire.request("add", 26, ledger=1, entry=0, data=entry(1, 0) + b"\0")), 26, "bad_entry"),
    ]
    for frame, rid, code in cases:
        c.send_raw(frame)
        reply = c.recv()
        assert reply["ok"] is False, (frame[:40], reply)
        assert reply["error"] == code, (frame[:40], reply)
        assert reply["rid"] == rid and reply["message"]
    # Frames before the last are an envelope (as a REQ socket sends): echoed back, then the reply.
    c.sock.send_multipart([b"", wire.encode(wire.request("ping", 30))])
    echoed = c.sock.recv_multipart()
    assert echoed[0] == b"" and wire.decode(echoed[-1])["rid"] == 30

    data = entry(1, 0)
    add = c.call("add", ledger=1, entry=0, data=data)
    assert add["ok"] and (add["ledger"], add["entry"]) == (1, 0)
    read = c.call("read", ledger=1, entry=0)
    assert read["ok"] and read["data"] == data
    stats = c.call("stats")
    assert stats["bad_requests"] == len(cases)
    assert stats["adds"] == 1 and stats["reads"] == 1 and stats["entries"] == 1 and stats["ledgers"] == 1
    assert bookie.alive()


def test_read_errors_and_lac(cluster, procs, client_for):
    bookie = procs.start_bookie(cluster)
    c = client_for(bookie.address)
    assert c.call("read", ledger=9, entry=0)["error"] == "no_entry"
    unknown = c.call("read_lac", ledger=9)
    assert unknown["ok"] and (unknown["lac"], unknown["last_entry"], unknown["fenced"]) == (-1, -1, False)
    for i in range(3):
        assert c.call("add", ledger=9, entry=i, data=entry(9, i, lac=i - 1))["ok"]
    lac = c.call("read_lac", ledger=9)
    assert (lac["lac"], lac["last_entry"], lac["fenced"]) == (1, 2, False)
    assert c.call("read", ledger=9, entry=5)["error"] == "no_entry"
    assert c.call("delete", ledger=9)["ok"]
    assert c.call("read", ledger=9, entry=0)["error"] == "no_entry"
    assert c.call("read_lac", ledger=9)["lac"] == -1


def test_a_bookie_refuses_another_clusters_data_dir(cluster, procs, client_for, zk_server):
    bookie = procs.start_bookie(cluster)
    assert client_for(bookie.address).call("add", ledger=1, entry=0, data=entry(1, 0))["ok"]
    assert bookie.terminate() == 0
    first_id = json.loads(cluster.zk.get(cluster.paths.config)[0])["cluster_id"]

    other = f"t{uuid.uuid4().hex[:10]}"
    args = [
        "bookie",
        "start",
        "--data",
        str(bookie.data_dir),
        "--listen",
        bookie.address,
        "--zk",
        cluster.hosts,
        "--cluster",
        other,
    ]
    intruder = procs.start("bookie-other", args)
    assert intruder.wait(60) == 1
    other_id = json.loads(cluster.zk.get(ClusterPaths(other).config)[0])["cluster_id"]
    output = intruder.output()
    for word in (cluster.name, first_id, other, other_id):
        assert word in output, output
    assert json.loads((bookie.data_dir / "COOKIE").read_text())["cluster"] == cluster.name
    cluster.zk.delete(ClusterPaths(other).base, recursive=True)


def test_sigkill_mid_stream_keeps_every_acked_entry(cluster, procs, client_for):
    bookie = procs.start_bookie(cluster)
    c = client_for(bookie.address)
    total, kill_after = 3000, 400
    data = {i: entry(5, i, lac=i - 1, payload=bytes([i % 251]) * 200) for i in range(total)}
    rids = {}
    for i in range(total):
        rids[c.send("add", ledger=5, entry=i, data=data[i])] = i
    acked = set()
    while len(acked) < kill_after:
        reply = c.recv(timeout_ms=10000)
        assert reply["ok"], reply
        acked.add(rids[reply["rid"]])
    bookie.kill()
    c.close()

    restarted = procs.restart(bookie)
    c = client_for(restarted.address)
    for i in sorted(acked):
        reply = c.call("read", ledger=5, entry=i)
        assert reply.get("data") == data[i], f"acked entry {i} lost: {reply}"
    info = c.call("read_lac", ledger=5)
    assert info["last_entry"] >= max(acked) and info["lac"] >= max(acked) - 1
    stats = c.call("stats")
    assert stats["entries"] >= len(acked)
    assert stats["batches"] == 0  # a fresh process: the entries came from disk


def test_fence_persists_across_restart(cluster, procs, client_for):
    bookie = procs.start_bookie(cluster)
    c = client_for(bookie.address)
    for i in range(3):
        assert c.call("add", ledger=3, entry=i, data=entry(3, i, lac=i - 1))["ok"]
    fence = c.call("fence", ledger=3)
    assert fence["ok"] and (fence["lac"], fence["last_entry"], fence["fenced"]) == (1, 2, True)
    refused = c.call("add", ledger=3, entry=3, data=entry(3, 3, lac=2))
    assert refused["ok"] is False and refused["error"] == "fenced"
    assert c.call("fence", ledger=77)["fenced"] is True  # a ledger it never saw
    bookie.kill()

    restarted = procs.restart(bookie)
    c = client_for(restarted.address)
    info = c.call("read_lac", ledger=3)
    assert (info["lac"], info["last_entry"], info["fenced"]) == (1, 2, True)
    assert c.call("add", ledger=3, entry=3, data=entry(3, 3, lac=2))["error"] == "fenced"
    assert c.call("add", ledger=77, entry=0, data=entry(77, 0))["error"] == "fenced"
    assert c.call("read", ledger=3, entry=2)["data"] == entry(3, 2, lac=1)
    # Recovery re-replicates onto fenced bookies.
    assert c.call("add", ledger=3, entry=3, data=entry(3, 3, lac=2), recovery=True)["ok"]
    assert c.call("read_lac", ledger=3)["last_entry"] == 3


def test_wait_lac_wakes_on_add_and_times_out(cluster, procs, client_for):
    bookie = procs.start_bookie(cluster)
    poller, writer = client_for(bookie.address), client_for(bookie.address)

    # That a poll is not answered early is tests/unit/test_bookie_polls.py's; here a wrong early answer
    # would arrive first and carry lac -1.
    rid = poller.send("wait_lac", ledger=4, after=-1, timeout_ms=20000)
    assert writer.call("add", ledger=4, entry=0, data=entry(4, 0, lac=-1))["ok"]  # lac still -1: keep waiting
    started = time.monotonic()
    assert writer.call("add", ledger=4, entry=1, data=entry(4, 1, lac=0))["ok"]
    woken = poller.recv(timeout_ms=3000)
    assert time.monotonic() - started < 2
    assert woken["rid"] == rid and woken["ok"] and (woken["lac"], woken["last_entry"]) == (0, 1)

    # Already satisfied: answered at once.
    assert poller.call("wait_lac", ledger=4, after=-1, timeout_ms=20000)["lac"] == 0

    started = time.monotonic()
    rid = poller.send("wait_lac", ledger=4, after=0, timeout_ms=400)
    timed_out = poller.recv(timeout_ms=5000)
    elapsed = time.monotonic() - started
    assert timed_out["rid"] == rid and timed_out["lac"] == 0 and timed_out["fenced"] is False
    assert 0.35 <= elapsed < 3, elapsed

    # Unknown ledgers wait too, and a fence wakes the waiters at once.
    requests = writer.call("stats")["requests"]
    rid = poller.send("wait_lac", ledger=6, after=-1, timeout_ms=20000)
    # The bookie handles requests in turn: once a later one counts two more, the poll is parked.
    wait_for(lambda: writer.call("stats")["requests"] >= requests + 2, 10, "the poll to be parked")
    assert writer.call("fence", ledger=6)["fenced"] is True
    woken = poller.recv(timeout_ms=3000)
    assert woken["rid"] == rid and woken["fenced"] is True and woken["lac"] == -1


def test_wait_lac_carries_the_committed_entries_it_waited_for(cluster, procs, client_for):
    bookie = procs.start_bookie(cluster)
    poller, writer = client_for(bookie.address), client_for(bookie.address)
    for i in range(3):
        assert writer.call("add", ledger=8, entry=i, data=entry(8, i, lac=i - 1))["ok"]
    # LAC 1: entries 0 and 1 are committed, entry 2 is not and must not ride along.
    reply = poller.call("wait_lac", ledger=8, after=-1, timeout_ms=1000, max_entries=10)
    assert reply["lac"] == 1 and reply["entries"] == [entry(8, 0, lac=-1), entry(8, 1, lac=0)]
    assert poller.call("wait_lac", ledger=8, after=0, timeout_ms=1000, max_entries=1)["entries"] == [
        entry(8, 1, lac=0)
    ]
    # Parked, then woken by the add that commits entry 2: the reply carries it (an early answer
    # would arrive first, with lac 1).
    rid = poller.send("wait_lac", ledger=8, after=1, timeout_ms=20000, max_entries=10)
    assert writer.call("add", ledger=8, entry=3, data=entry(8, 3, lac=2))["ok"]
    woken = poller.recv(timeout_ms=3000)
    assert woken["rid"] == rid and woken["lac"] == 2 and woken["entries"] == [entry(8, 2, lac=1)]
    # Without max_entries nothing rides along (the old reply).
    assert "entries" not in poller.call("wait_lac", ledger=8, after=-1, timeout_ms=0)


def test_many_concurrent_adds_are_group_committed(cluster, procs, client_for):
    bookie = procs.start_bookie(cluster)
    c = client_for(bookie.address)
    n = 2000
    for i in range(n):
        c.send("add", ledger=8, entry=i, data=entry(8, i, lac=i - 1))
    replies = [c.recv(timeout_ms=30000) for _ in range(n)]
    assert all(r["ok"] for r in replies)
    stats = c.call("stats")
    assert stats["adds"] == n
    assert stats["batches"] < n  # several adds shared each fsynced transaction


def test_add_batch_stores_a_run_and_answers_once(cluster, procs, client_for):
    bookie = procs.start_bookie(cluster)
    c = client_for(bookie.address)
    run = [entry(12, i, lac=i - 2) for i in range(5, 305)]
    reply = c.call("add_batch", ledger=12, first=5, entries=run)
    assert reply["ok"] and (reply["ledger"], reply["first"], reply["count"]) == (12, 5, 300)
    # Exactly one reply for the whole batch: a second one would be read by the next call, whose rid differs.
    assert [c.call("read", ledger=12, entry=i)["data"] for i in (5, 100, 304)] == [run[0], run[95], run[299]]
    info = c.call("read_lac", ledger=12)
    assert (info["lac"], info["last_entry"], info["fenced"]) == (302, 304, False)
    # Pipelined batches and single adds share group commits; every request gets its one reply.
    rids = [
        c.send("add_batch", ledger=13, first=10 * k, entries=[entry(13, 10 * k + i) for i in range(10)])
        for k in range(50)
    ]
    rids.append(c.send("add", ledger=13, entry=500, data=entry(13, 500)))
    replies = [c.recv(timeout_ms=10000) for _ in rids]
    assert sorted(r["rid"] for r in replies) == sorted(rids) and all(r["ok"] for r in replies)
    stats = c.call("stats")
    assert stats["adds"] == 300 + 501 and stats["entries"] == 801 and stats["bad_requests"] == 0


def test_add_batch_bad_input_gets_error_replies_and_the_bookie_keeps_serving(cluster, procs, client_for):
    bookie = procs.start_bookie(cluster)
    c = client_for(bookie.address, timeout_ms=20000)
    good = [entry(1, 0), entry(1, 1)]
    cases = [
        (dict(ledger=1, first=0), wire.E_BAD_REQUEST),  # no entries
        (dict(ledger=1, first=0, entries=b"".join(good)), wire.E_BAD_REQUEST),  # not a list
        (dict(ledger=1, first=0, entries={"0": good[0]}), wire.E_BAD_REQUEST),
        (dict(ledger=1, first=0, entries=[]), wire.E_BAD_REQUEST),  # empty
        (dict(ledger=1, first=0, entries=[good[0]] * 10_001), wire.E_BAD_REQUEST),  # too many
        (dict(ledger="1", first=0, entries=good), wire.E_BAD_REQUEST),
        (dict(ledger=1, first=-1, entries=good), wire.E_BAD_REQUEST),
        (dict(ledger=1, entries=good), wire.E_BAD_REQUEST),  # no first
        (dict(ledger=1, first=(1 << 64) - 1, entries=good), wire.E_BAD_REQUEST),  # ids past 2^64
        (dict(ledger=1, first=0, entries=good, recovery="yes"), wire.E_BAD_REQUEST),
        (dict(ledger=1, first=0, entries=[good[0], "text"]), "bad_entry"),
        (dict(ledger=1, first=0, entries=[good[0], 7]), "bad_entry"),
        (dict(ledger=1, first=0, entries=[good[0], None]), "bad_entry"),
        (dict(ledger=1, first=0, entries=[good[0], b"short"]), "bad_entry"),
        (dict(ledger=1, first=0, entries=[good[0], good[1] + b"\0"]), "bad_entry"),  # framing
        (dict(ledger=1, first=0, entries=[good[1], good[0]]), "bad_entry"),  # out of order
        (dict(ledger=1, first=0, entries=[good[0], entry(1, 2)]), "bad_entry"),  # a gap
        (dict(ledger=1, first=1, entries=good), "bad_entry"),  # first does not match
        (dict(ledger=2, first=0, entries=good), "bad_entry"),  # another ledger's entries
        (dict(ledger=1, first=0, entries=[good[0]] * 1000 + [b"x" * (8 * 1024 * 1024)]), wire.E_OVERSIZED),
    ]
    for i, (fields, code) in enumerate(cases):
        rid = c.send("add_batch", **fields)
        reply = c.recv()
        assert reply["rid"] == rid and reply["ok"] is False, (i, reply)
        assert reply["error"] == code and reply["message"], (i, reply)
    # Nothing of a refused batch was stored, even its good first entry.
    assert c.call("read", ledger=1, entry=0)["error"] == "no_entry"
    assert c.call("read_lac", ledger=1)["last_entry"] == -1
    stats = c.call("stats")
    assert stats["bad_requests"] == len(cases) and stats["adds"] == 0 and stats["entries"] == 0
    assert c.call("add_batch", ledger=1, first=0, entries=good)["count"] == 2
    assert bookie.alive()


def test_add_batch_on_a_fenced_ledger_refuses_every_entry(cluster, procs, client_for):
    bookie = procs.start_bookie(cluster)
    writer, recoverer = client_for(bookie.address), client_for(bookie.address)
    assert writer.call("add_batch", ledger=3, first=0, entries=[entry(3, i, lac=i - 1) for i in range(4)])[
        "ok"
    ]
    # Batches pipelined around a fence: each is stored whole or refused whole, with one reply,
    # and nothing sent after the fence was acknowledged is stored.
    before = [
        writer.send(
            "add_batch", ledger=3, first=4 + 10 * k, entries=[entry(3, 4 + 10 * k + i) for i in range(10)]
        )
        for k in range(20)
    ]
    fence = recoverer.call("fence", ledger=3)
    assert fence["fenced"] is True
    fenced_at = fence["last_entry"]
    after = writer.send("add_batch", ledger=3, first=204, entries=[entry(3, 204 + i) for i in range(10)])
    replies = {r["rid"]: r for r in (writer.recv(timeout_ms=10000) for _ in range(len(before) + 1))}
    assert sorted(replies) == sorted(before + [after])
    assert replies[after]["ok"] is False and replies[after]["error"] == "fenced"
    for k, rid in enumerate(before):
        reply = replies[rid]
        first = 4 + 10 * k
        if reply["ok"]:
            assert reply["count"] == 10 and first + 9 <= fenced_at
        else:
            assert reply["error"] == "fenced" and first > fenced_at
            assert writer.call("read", ledger=3, entry=first)["error"] == "no_entry"
    assert writer.call("read", ledger=3, entry=204)["error"] == "no_entry"
    info = writer.call("read_lac", ledger=3)
    assert info["fenced"] is True and info["last_entry"] == fenced_at
    # A recovery batch is accepted on the fenced ledger.
    redo = writer.call(
        "add_batch", ledger=3, first=204, entries=[entry(3, 204), entry(3, 205)], recovery=True
    )
    assert redo["ok"] and redo["count"] == 2
    assert writer.call("read_lac", ledger=3)["last_entry"] == 205
    assert writer.call("stats")["bad_requests"] == 0


def test_registration_comes_back_after_a_session_expiry(cluster, tmp_path, free_port, client_for):
    import threading

    from ledger.bookie.config import BookieConfig
    from ledger.bookie.server import Bookie
    from tests.support.harness import expire_session

    config = BookieConfig(
        data=str(tmp_path / "b"),
        listen=f"tcp://127.0.0.1:{free_port()}",
        zk=cluster.hosts,
        cluster=cluster.name,
        bookie_id="in-process",
        map_size_bytes=64 << 20,
        zk_session_timeout_s=4,
        init_if_missing=True,
    )
    bookie, stop = Bookie(config), threading.Event()
    bookie.start()
    thread = threading.Thread(target=bookie.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        path = cluster.paths.bookie("in-process")
        first = cluster.zk.exists(path)
        assert first is not None
        expire_session(cluster.hosts, *bookie._zk.client_id)
        deadline = time.monotonic() + 20
        while True:
            stat = cluster.zk.exists(path)
            if stat is not None and stat.ephemeralOwner != first.ephemeralOwner:
                break
            assert time.monotonic() < deadline, "the bookie did not re-register"
            time.sleep(0.1)
        assert json.loads(cluster.zk.get(path)[0])["address"] == config.listen
        assert client_for(config.listen).call("ping")["bookie_id"] == "in-process"
    finally:
        stop.set()
        thread.join(10)
        bookie.close()
    assert not thread.is_alive()
    assert cluster.zk.exists(cluster.paths.bookie("in-process")) is None


def test_two_live_bookies_cannot_share_an_id(cluster, procs, tmp_path, free_port):
    from ledger import LedgerError
    from ledger.bookie.config import BookieConfig
    from ledger.bookie.server import Bookie

    first = procs.start_bookie(cluster)
    bookie_id = json.loads((first.data_dir / "COOKIE").read_text())["bookie_id"]
    config = BookieConfig(
        data=str(tmp_path / "twin"),
        listen=f"tcp://127.0.0.1:{free_port()}",
        zk=cluster.hosts,
        cluster=cluster.name,
        bookie_id=bookie_id,
        map_size_bytes=64 << 20,
        zk_session_timeout_s=1,
    )
    # Another data directory under the same id is refused by the ZooKeeper cookie already.
    with pytest.raises(LedgerError, match="belongs to another data directory"):
        Bookie(config).start()
    assert json.loads(cluster.zk.get(cluster.paths.bookie(bookie_id))[0])["address"] == first.address
    assert first.alive()


def test_a_wiped_data_dir_cannot_come_back_under_the_same_bookie_id(cluster, procs):
    import shutil

    bookie = procs.start_bookie(cluster)
    bookie.terminate()
    shutil.rmtree(bookie.data_dir)
    again = procs.start("bookie", bookie.args)
    assert again.wait(30) != 0
    out = again.output()
    assert "belongs to another data directory" in out and "--bookie-id" in out
