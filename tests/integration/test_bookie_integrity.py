"""Real bookie processes that cannot vouch for their data: refusals at start, limbo after a crash,
read-only mode on a full disk."""

from __future__ import annotations

import json
import os
import shlex
import shutil

import pytest

from tests.support.bookie_client import entry
from tests.support.harness import answers_ping as _answers_ping
from tests.support.harness import wait_for
from tests.support.journal import wait_checkpointed
from tests.support.ledgers import corrupt_entry_on_disk

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def filled_bookie(procs, cluster, client_for, entries: int = 3000):
    """A bookie holding ledger 1 (``entries`` entries of 400 bytes), stopped in order."""
    bookie = procs.start_bookie(cluster)
    c = client_for(bookie.address)
    for first in range(0, entries, 500):
        run = [entry(1, i, lac=i - 1, payload=bytes([i % 251]) * 400) for i in range(first, first + 500)]
        assert c.call("add_batch", ledger=1, first=first, entries=run)["ok"]
    assert bookie.terminate() == 0
    return bookie


def refused(procs, bookie) -> tuple[int, str]:
    """Start ``bookie`` again; it must exit on its own. Its exit code and output."""
    again = procs.start("bookie-again", bookie.args, data_dir=bookie.data_dir)
    code = again.wait(60)
    return code, again.output()


def refusal_line(output: str) -> str:
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if "refuses to start" in line]
    assert len(lines) == 1, output
    assert lines[0].startswith("fencepost: bookie "), lines[0]
    return lines[0]


def test_a_truncated_data_file_is_one_line_not_a_sigbus(cluster, procs, client_for):
    bookie = filled_bookie(procs, cluster, client_for)
    path = bookie.data_dir / "data.mdb"
    os.truncate(path, path.stat().st_size // 2)
    code, output = refused(procs, bookie)
    assert code == 1, (code, output)  # SIGBUS would be -7
    line = refusal_line(output)
    assert "is truncated" in line and "fencepost bookie start --data" in line

    # The command it names re-registers the bookie under a new id on a fresh directory.
    command = line.split("run: ", 1)[1]
    move, start = command.split(" && ")
    _, src, dst = shlex.split(move)
    os.rename(src, dst)
    args = shlex.split(start)[1:]
    new_id = args[args.index("--bookie-id") + 1]
    renewed = procs.start(
        "bookie-renewed", args, ready=lambda p: cluster.zk.exists(cluster.paths.bookie(new_id))
    )
    assert renewed.alive() and os.path.exists(os.path.join(dst, "COOKIE"))


def test_a_deleted_data_file_with_its_cookie_kept_is_refused(cluster, procs, client_for):
    bookie = filled_bookie(procs, cluster, client_for, entries=500)
    os.unlink(bookie.data_dir / "data.mdb")
    code, output = refused(procs, bookie)
    assert code == 1
    assert "data.mdb is missing although the cookie" in refusal_line(output)
    assert not (bookie.data_dir / "data.mdb").exists()  # nothing was created in its place


def test_an_empty_data_file_is_refused(cluster, procs, client_for):
    bookie = filled_bookie(procs, cluster, client_for, entries=500)
    os.truncate(bookie.data_dir / "data.mdb", 0)
    code, output = refused(procs, bookie)
    assert code == 1 and "is empty (0 bytes)" in refusal_line(output)


def test_another_bookies_data_file_is_refused(cluster, procs, client_for):
    bookie = filled_bookie(procs, cluster, client_for, entries=500)
    other = filled_bookie(procs, cluster, client_for, entries=500)
    shutil.copyfile(other.data_dir / "data.mdb", bookie.data_dir / "data.mdb")
    code, output = refused(procs, bookie)
    line = refusal_line(output)
    assert code == 1 and "but its cookie names instance" in line


def test_after_an_unclean_stop_a_damaged_entry_is_named_and_answered_unknown(cluster, procs, client_for):
    bookie = procs.start_bookie(cluster, extra=["--journal-checkpoint-s", "0.1"])
    c = client_for(bookie.address)
    assert c.call("add_batch", ledger=1, first=0, entries=[entry(1, i, lac=i - 1) for i in range(10)])["ok"]
    assert c.call("add_batch", ledger=2, first=0, entries=[entry(2, i, lac=i - 1) for i in range(5)])["ok"]
    # Damage the journal no longer covers: replay would repair an entry it still holds.
    wait_checkpointed(c)
    bookie.kill()
    corrupt_entry_on_disk(bookie.data_dir, 1, 5)

    restarted = procs.restart(bookie)
    output = restarted.output()
    assert "was not shut down cleanly: verifying its store" in output
    assert "ledger 1 entry 5 is damaged on this bookie (bad crc32c digest)" in output
    assert "verified 15 entries" in output and "Traceback" not in output
    c = client_for(restarted.address)
    for op, fields in (
        ("read", {"entry": 5}),
        ("read", {"entry": 50}),
        ("read_lac", {}),
        ("fence", {}),
        ("wait_lac", {"after": -1, "timeout_ms": 0}),
    ):
        reply = c.call(op, ledger=1, **fields)
        assert reply["ok"] is False and reply["error"] == "unknown", (op, reply)
        assert "cannot vouch for ledger 1" in reply["message"]
    assert c.call("read", ledger=1, entry=6)["data"] == entry(1, 6, lac=5)  # verified copies are served
    assert c.call("read_lac", ledger=2)["lac"] == 3 and c.call("read", ledger=2, entry=4)["ok"]
    assert c.call("read", ledger=2, entry=50)["error"] == "no_entry"  # other ledgers: a plain "no"
    stats = c.call("stats")
    assert (
        stats["verified_at_start"] is True and stats["limbo_ledgers"] == 1 and stats["unknown_replies"] == 5
    )

    # Limbo outlives a clean restart (no verification then); deleting the ledger ends it.
    assert restarted.terminate() == 0
    again = procs.restart(restarted)
    c = client_for(again.address)
    assert "verifying its store" not in again.output()
    assert c.call("stats")["verified_at_start"] is False
    assert c.call("read", ledger=1, entry=5)["error"] == "unknown"
    assert c.call("delete", ledger=1)["ok"]
    assert c.call("read", ledger=1, entry=5)["error"] == "no_entry"


def test_a_full_disk_makes_the_bookie_read_only_with_one_warning_each_way(
    cluster, procs, client_for, free_port
):
    data_dir = procs.workdir / "tiny-bookie"
    address = f"tcp://127.0.0.1:{free_port()}"
    args = [
        "bookie",
        "start",
        "--data",
        str(data_dir),
        "--listen",
        address,
        "--zk",
        cluster.hosts,
        "--cluster",
        cluster.name,
    ]
    bookie = procs.start(
        "bookie", args, ready=_answers_ping, address=address, env={"FENCEPOST_MAP_SIZE_BYTES": str(1 << 20)}
    )
    c = client_for(address)
    # Ledger 1 takes big entries (overflow pages), freed at once when it is deleted.
    assert c.call(
        "add_batch", ledger=1, first=0, entries=[entry(1, i, payload=bytes(20_000)) for i in range(20)]
    )["ok"]
    refused_at = None
    for i in range(2000):
        reply = c.call("add", ledger=2, entry=i, data=entry(2, i, payload=bytes(2000)))
        if not reply["ok"]:
            assert reply["error"] == "readonly" and "disk is full" in reply["message"], reply
            refused_at = i
            break
    assert refused_at is not None, "the 1 MiB map never filled"
    # Entries as big as the one that did not fit: the bookie tries a real commit again every second,
    # and a small entry could fit where this one did not (on a loaded machine these 200 calls took
    # more than a second, and the bookie took a small one and was writable again).
    for i in range(200):
        reply = c.call(
            "add", ledger=2, entry=refused_at + i, data=entry(2, refused_at + i, payload=bytes(2000))
        )
        assert reply["error"] == "readonly", reply
    stats = c.call("stats")
    assert stats["readonly"] is True and stats["disk_full_events"] == 1 and stats["readonly_refusals"] >= 201
    node = cluster.paths.bookie(stats["bookie_id"])
    wait_for(
        lambda: json.loads(cluster.zk.get(node)[0])["readonly"] is True,
        10,
        "the registration to say readonly",
    )
    assert c.call("read", ledger=2, entry=0)["ok"]  # reads go on

    assert c.call("delete", ledger=1)["ok"]
    # The bookie retries a real commit about once a second: an add succeeds soon after space is freed.
    wait_for(lambda: c.call("add", ledger=3, entry=0, data=entry(3, 0))["ok"], 15, "an add after the delete")
    stats = c.call("stats")
    assert stats["readonly"] is False and stats["disk_full_events"] == 1
    wait_for(
        lambda: json.loads(cluster.zk.get(node)[0])["readonly"] is False,
        10,
        "the registration to say writable",
    )
    output = bookie.output()
    assert output.count("is read-only: its store is full") == 1, output
    assert output.count("is writable again") == 1, output
    assert "Traceback" not in output
    assert bookie.alive()
