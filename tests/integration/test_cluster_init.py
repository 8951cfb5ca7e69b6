"""`fencepost cluster init` and the cluster-wide options, with real ZooKeeper, bookies and brokers.

- init writes `config` once (a second init names the existing cluster id), refuses bad
  combinations in one line;
- a member whose options differ from `config` aborts naming each difference; a member
  started before init waits (not serving) and goes on once init has run;
- an hmac-sha256 cluster: entries carry HMACs keyed by the secret; an entry forged on a
  bookie's disk (a valid CRC32C, or an HMAC with another key) is refused by the readers
  (another replica is read, the corruption reported) and by recovery; brokers without the
  secret, or with another one, are refused at start; the secret is nowhere in ZooKeeper,
  the members' logs or `status --json`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import struct
import time
import uuid

import lmdb
import pytest

from election.cluster_config import read_cluster_config
from ledger.codec import HEADER_SIZE, Digest, Entry, encode_entry
from ledger.log import read_log
from ledger.metadata import CLOSED, read_metadata
from tests.support.bookie_client import Client
from tests.support.harness import answers_ping as _answers_ping
from tests.support.harness import call, wait_for
from tests.support.ledgers import holds_entries, make_client, procs_in_ensemble_order, wait_registered

pytestmark = pytest.mark.integration

SECRET = b"fencepost-test-secret-" + uuid.uuid4().hex.encode()


def _init(procs, cluster, *flags: str):
    return procs.run(["cluster", "init", "--zk", cluster.hosts, "--cluster", cluster.name, *flags])


def _one_line(result) -> str:
    """The one-line reason of a failed command (the last line of stderr; logs may come before it)."""
    lines = result.stderr.decode().strip().splitlines()
    assert lines, result
    return lines[-1]


def _secret_file(tmp_path, secret: bytes = SECRET):
    path = tmp_path / f"secret-{uuid.uuid4().hex[:6]}"
    path.write_bytes(secret + b"\n")
    return path


def _member_args(kind: str, procs, cluster, *extra: str) -> list[str]:
    data = procs.workdir / f"{kind}-{uuid.uuid4().hex[:6]}"
    return [
        kind,
        "start",
        "--data",
        str(data),
        "--listen",
        "tcp://127.0.0.1:1",
        "--zk",
        cluster.hosts,
        "--cluster",
        cluster.name,
        *extra,
    ]


# ------------------------------------------------------------------ init itself
def test_init_writes_config_once_and_refuses_a_second_time(cluster, procs):
    result = _init(
        procs,
        cluster,
        "--write-quorum",
        "5",
        "--ack-quorum",
        "3",
        "--ensemble-size",
        "5",
        "--max-payload-bytes",
        "4096",
        "--json",
    )
    assert result.returncode == 0, result.stderr.decode()
    printed = json.loads(result.stdout)
    stored = read_cluster_config(cluster.zk, cluster.paths)
    assert printed["cluster"] == cluster.name
    assert {k: v for k, v in printed.items() if k != "cluster"} == stored
    assert uuid.UUID(stored["cluster_id"]).version == 4
    assert (
        stored["write_quorum"],
        stored["ack_quorum"],
        stored["ensemble_size"],
        stored["digest"],
        stored["max_payload_bytes"],
        stored["format_version"],
    ) == (5, 3, 5, "crc32c", 4096, 1)
    assert abs(stored["created_at"] - time.time()) < 60

    again = _init(procs, cluster)
    assert again.returncode == 1
    assert again.stderr.decode().count("\n") == 1
    assert stored["cluster_id"] in _one_line(again) and "already initialized" in _one_line(again)
    assert read_cluster_config(cluster.zk, cluster.paths) == stored  # untouched

    # Without --json: one summary line (another, fresh cluster).
    other = f"t{uuid.uuid4().hex[:10]}"
    human = procs.run(["cluster", "init", "--zk", cluster.hosts, "--cluster", other])
    assert human.returncode == 0, human.stderr.decode()
    assert human.stdout.decode().count("\n") == 1
    assert human.stdout.decode().startswith(f"cluster {other} initialized: id ")


def test_init_refuses_bad_combinations_in_one_line(cluster, procs, tmp_path):
    secret = _secret_file(tmp_path)
    empty = tmp_path / "empty"
    empty.write_bytes(b"\n")
    cases = [
        (
            ["--ack-quorum", "3", "--write-quorum", "2", "--ensemble-size", "2"],
            1,
            "ack_quorum <= write_quorum",
        ),
        (["--write-quorum", "2"], 1, "write_quorum must equal ensemble_size"),
        (["--digest", "hmac-sha256"], 1, "give --secret-file"),
        (["--secret-file", str(secret)], 1, "only used with --digest hmac-sha256"),
        (["--digest", "hmac-sha256", "--secret-file", str(empty)], 1, "is empty"),
        (
            ["--digest", "hmac-sha256", "--secret-file", str(tmp_path / "none")],
            1,
            "cannot read the secret file",
        ),
        (["--digest", "md5"], 2, "--digest"),
        (["--max-payload-bytes", "0"], 2, "--max-payload-bytes"),
    ]
    for flags, code, text in cases:
        result = _init(procs, cluster, *flags)
        assert result.returncode == code, (flags, result.stderr.decode())
        if code == 1:
            assert result.stderr.decode().count("\n") == 1, (flags, result.stderr.decode())
            assert text in _one_line(result), (flags, result.stderr.decode())
        else:
            assert text in result.stderr.decode()
    assert read_cluster_config(cluster.zk, cluster.paths) is None  # nothing was written


# ------------------------------------------------------------------ members compare
@pytest.mark.timeout(120)
def test_members_whose_options_differ_abort_naming_each_difference(cluster, procs):
    assert _init(procs, cluster).returncode == 0
    broker = procs.run(
        _member_args(
            "broker", procs, cluster, "--write-quorum", "2", "--ensemble-size", "3", "--ack-quorum", "2"
        ),
        timeout=60,
    )
    assert broker.returncode == 1, broker.stderr.decode()
    line = _one_line(broker)
    assert "write_quorum: cluster has 3, this member has 2" in line
    assert "ensemble_size" not in line and "ack_quorum" not in line  # equal values set are no difference

    bookie = procs.run(
        _member_args(
            "bookie",
            procs,
            cluster,
            "--ack-quorum",
            "3",
            "--digest",
            "hmac-sha256",
            "--max-payload-bytes",
            "1048576",
        ),
        timeout=60,
    )
    assert bookie.returncode == 1, bookie.stderr.decode()
    line = _one_line(bookie)
    assert "ack_quorum: cluster has 2, this member has 3" in line
    assert "digest: cluster has crc32c, this member has hmac-sha256" in line
    assert "max_payload_bytes" not in line

    # A broker whose environment sets an option compares it too.
    env_broker = procs.run(
        _member_args("broker", procs, cluster), env={"FENCEPOST_MAX_PAYLOAD_BYTES": "10"}, timeout=60
    )
    assert env_broker.returncode == 1
    assert "max_payload_bytes: cluster has 1048576, this member has 10" in _one_line(env_broker)


@pytest.mark.timeout(180)
def test_members_started_before_init_wait_for_it_then_serve(cluster, procs):
    wait_line = f"waiting for `fencepost cluster init` of cluster {cluster.name}"
    bookies = [procs.start_bookie(cluster, init_if_missing=False, ready=False) for _ in range(3)]
    broker = procs.start_broker(cluster, init_if_missing=False, ready=False)
    quitter = procs.start_broker(cluster, init_if_missing=False, ready=False)
    try:
        for proc in (*bookies, broker, quitter):
            wait_for(lambda p=proc: wait_line in p.output(), 30, f"{proc.name} to log that it waits")
        time.sleep(1.0)
        for proc in (*bookies, broker):
            assert proc.alive() and not _answers_ping(proc), proc.output()[-2000:]
            assert proc.output().count(wait_line) == 1  # one line, however long it waits
        assert read_cluster_config(cluster.zk, cluster.paths) is None  # nobody created it meanwhile

        # SIGTERM while waiting: a prompt, orderly exit.
        started = time.monotonic()
        assert quitter.terminate(timeout=10) == 0
        assert time.monotonic() - started < 5

        result = _init(procs, cluster)
        assert result.returncode == 0, result.stderr.decode()
        wait_for(lambda: all(_answers_ping(p) for p in (*bookies, broker)), 30, "members to serve after init")
        info = wait_for(
            lambda: (
                cluster.zk.exists(cluster.paths.leader)
                and json.loads(cluster.zk.get(cluster.paths.leader)[0])
            ),
            30,
            "a leader",
        )
        reply = call(info["address"], "submit", queue="q", payload=b"after init", timeout=10)
        assert reply["ok"], reply
        config = read_cluster_config(cluster.zk, cluster.paths)
        cookie = json.loads((bookies[0].data_dir / "COOKIE").read_text())
        assert cookie["cluster_id"] == config["cluster_id"]
    finally:
        procs.stop_all()


# ------------------------------------------------------------------ hmac-sha256
def _hmac_entry_ok(data: bytes, secret: bytes) -> bool:
    body, mac = data[:-32], data[-32:]
    return hmac.compare_digest(hmac.new(secret, body, hashlib.sha256).digest(), mac)


def _forge_on_disk(data_dir, ledger_id: int, entry_id: int, key: bytes | None) -> bytes:
    """Rewrite one entry in a stopped bookie's LMDB (``entries``: ``>QQ`` -> the entry's bytes) as
    someone without the secret would: same header, another payload, and a valid CRC32C digest
    (``key`` None) or an HMAC under ``key``. Returns the forged bytes."""
    env = lmdb.open(str(data_dir), subdir=True, max_dbs=8, map_size=1 << 30)
    try:
        db = env.open_db(b"entries")
        where = struct.pack(">QQ", ledger_id, entry_id)
        with env.begin(write=True) as txn:
            _ledger, _entry, lac, epoch, _length = struct.unpack_from(">QQqQI", bytes(txn.get(where, db=db)))
            digest = Digest.crc32c() if key is None else Digest.hmac_sha256(key)
            forged = encode_entry(Entry(ledger_id, entry_id, lac, epoch, b"forged payload"), digest)
            txn.put(where, forged, db=db)
        return forged
    finally:
        env.close()


@pytest.mark.timeout(240)
def test_hmac_cluster_entries_forgeries_and_the_secret_stays_secret(cluster, procs, tmp_path, caplog):
    secret_file = _secret_file(tmp_path)
    result = _init(procs, cluster, "--digest", "hmac-sha256", "--secret-file", str(secret_file), "--json")
    assert result.returncode == 0, result.stderr.decode()
    assert SECRET.decode() not in result.stdout.decode() + result.stderr.decode()
    config = read_cluster_config(cluster.zk, cluster.paths)
    assert config["digest"] == "hmac-sha256"

    # Brokers without the secret, or with another one, are refused at start, in one line.
    missing = procs.run(_member_args("broker", procs, cluster), timeout=60)
    assert missing.returncode == 1 and "uses the hmac-sha256 digest" in _one_line(missing)
    assert "--secret-file" in _one_line(missing)
    wrong = procs.run(
        _member_args(
            "broker", procs, cluster, "--secret-file", str(_secret_file(tmp_path, b"another secret"))
        ),
        timeout=60,
    )
    assert wrong.returncode == 1 and "is not the secret of cluster" in _one_line(wrong)

    # Debug logging: the secret must not show up even there.
    debug = {"FENCEPOST_LOG_LEVEL": "debug"}
    bookies = procs.start_bookies(cluster, 3, env=debug)
    brokers = procs.start_brokers(cluster, 2, extra=["--secret-file", str(secret_file)], env=debug)
    leader = wait_for(
        lambda: (
            cluster.zk.exists(cluster.paths.leader) and json.loads(cluster.zk.get(cluster.paths.leader)[0])
        ),
        30,
        "a leader",
    )
    task = call(leader["address"], "submit", queue="q", payload=b"signed", timeout=10)
    assert task["ok"], task

    # The leader's entries carry HMAC-SHA256 digests keyed by the secret (not CRC32C).
    ledgers, _ = read_log(cluster.zk, cluster.paths)
    first = ledgers[0]["id"]
    meta, _ = read_metadata(cluster.zk, cluster.paths, first)
    raw = Client(meta.ensemble[0]["address"]).call("read", ledger=first, entry=0)
    data = raw["data"]
    length = struct.unpack_from(">QQqQI", data)[4]
    assert len(data) == HEADER_SIZE + length + 32 and _hmac_entry_ok(data, SECRET)
    # Commands reading the ledgers themselves need the secret too.
    where = ["--zk", cluster.hosts, "--cluster", cluster.name]
    epochs = procs.run(["admin", "epochs", *where, "--json", "--secret-file", str(secret_file)], timeout=60)
    assert epochs.returncode == 0, epochs.stderr.decode()
    assert [row["broker_id"] for row in json.loads(epochs.stdout)] == [leader["broker_id"]]
    no_secret = procs.run(["admin", "epochs", *where], timeout=60)
    assert no_secret.returncode == 1 and "hmac-sha256" in _one_line(no_secret)

    # Readers: a copy forged on disk is treated as missing, another replica read, the forgery reported.
    client = make_client(cluster, secret=SECRET)
    try:
        wait_registered(cluster, 3)
        writer = client.create(epoch=99)
        for i in range(10):
            writer.add_sync(b"value-%d" % i)
        writer.close()
        meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
        target = procs_in_ensemble_order(bookies, meta)[0]  # the replica a reader tries first
        # Acknowledged by 2 of 3: this bookie's copies may still be on their way (a loaded machine).
        wait_for(
            lambda: holds_entries(client, target.address, writer.ledger_id, range(10)),
            30,
            "the first bookie to hold every entry",
        )
        assert target.terminate() == 0  # stopped in order: it will not re-verify its store at start
        crc_forgery = _forge_on_disk(target.data_dir, writer.ledger_id, 4, key=None)
        _forge_on_disk(target.data_dir, writer.ledger_id, 5, key=b"not-the-cluster-secret")
        target = procs.restart(target)
        assert Client(target.address).call("read", ledger=writer.ledger_id, entry=4)["data"] == crc_forgery

        reader = client.open_reader(writer.ledger_id)
        assert reader.read(4).payload == b"value-4"
        assert reader.read(5).payload == b"value-5"
        bad = [(b, e) for b, _l, e, r in reader.corruptions if r.startswith("corrupt")]
        assert bad == [(meta.ensemble[0]["bookie_id"], 4), (meta.ensemble[0]["bookie_id"], 5)]
        assert [e.payload for e in reader.read_range(0, 9)] == [b"value-%d" % i for i in range(10)]

        # Recovery: the forged copy of the last entry (past the LAC, so only recovery settles it)
        # is not taken, even when the only other bookie up holds the real one.
        writer = client.create(epoch=100)
        for i in range(5):
            writer.add_sync(b"open-%d" % i)
        meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
        ordered = procs_in_ensemble_order(bookies, meta)
        forged_on, third = ordered[0], ordered[2]
        wait_for(
            lambda: holds_entries(client, forged_on.address, writer.ledger_id, range(5)),
            30,
            "the bookie to forge on holding the last entry",
        )
        assert forged_on.terminate() == 0
        _forge_on_disk(forged_on.data_dir, writer.ledger_id, 4, key=None)
        procs.restart(forged_on)
        third.kill()  # the writer "dies" too: recovery has the forger and one honest bookie
        other = make_client(cluster, secret=SECRET)
        try:
            with caplog.at_level(logging.WARNING, logger="ledger.client.recovery"):
                assert other.recover_and_close(writer.ledger_id) == 4
            assert any("entry 4" in r.getMessage() and "corrupt" in r.getMessage() for r in caplog.records)
            meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
            assert (meta.state, meta.last_entry) == (CLOSED, 4)
            reader = other.open_reader(writer.ledger_id)
            assert [e.payload for e in reader.read_range(0, 4)] == [b"open-%d" % i for i in range(5)]
        finally:
            other.close()
        procs.restart(third)
    finally:
        client.close()

    # The secret is nowhere: not in ZooKeeper, not in any member's log, not in `status --json`.
    status = procs.run(["status", "--zk", cluster.hosts, "--cluster", cluster.name, "--json"], timeout=60)
    assert status.returncode == 0, status.stderr.decode()
    json.loads(status.stdout)
    texts = {
        "status": status.stdout + status.stderr,
        "init": result.stdout + result.stderr,
        "refused brokers": missing.stderr + wrong.stderr,
        "epochs": epochs.stdout + epochs.stderr,
    }
    for path, data in _walk(cluster.zk, cluster.paths.base):
        texts[path] = data
    for proc in procs.procs:
        texts[f"{proc.name} {proc.pid}"] = proc.log_path.read_bytes()
    for needle in (SECRET, SECRET.hex().encode(), base64.b64encode(SECRET)):
        leaked = [where for where, text in texts.items() if needle in text]
        assert not leaked, f"the secret appears in {leaked}"
    assert all(b.alive() for b in brokers)


def _walk(zk, path: str):
    """Every node under ``path`` with its data."""
    data, _ = zk.get(path)
    yield path, data or b""
    for child in zk.get_children(path):
        yield from _walk(zk, f"{path}/{child}")


# ------------------------------------------------------------------ dev up
def _dev(procs, *args: str, timeout: float = 180):
    return procs.run(["dev", *args], timeout=timeout)


def _dev_config(dev_dir, cluster: str) -> dict:
    from election.paths import ClusterPaths
    from election.zk import close, connect

    state = json.loads((dev_dir / "cluster.json").read_text())
    zk = connect(state["zk"])
    try:
        return read_cluster_config(zk, ClusterPaths(cluster))
    finally:
        close(zk)


@pytest.mark.timeout(400)
def test_dev_up_runs_init_with_its_flags_and_keeps_the_config_on_a_second_up(procs, tmp_path):
    dev_dir = tmp_path / "dev"
    secret_file = _secret_file(tmp_path)
    where = ["--dev-dir", str(dev_dir)]
    try:
        up = _dev(
            procs,
            "up",
            *where,
            "--cluster",
            "dv",
            "--bookies",
            "3",
            "--brokers",
            "1",
            "--digest",
            "hmac-sha256",
            "--secret-file",
            str(secret_file),
            "--max-payload-bytes",
            "2048",
        )
        assert up.returncode == 0, up.stderr.decode()
        assert "cluster dv initialized (cluster id" in up.stdout.decode()
        config = _dev_config(dev_dir, "dv")
        assert (config["digest"], config["max_payload_bytes"], config["write_quorum"]) == (
            "hmac-sha256",
            2048,
            3,
        )
        state = json.loads((dev_dir / "cluster.json").read_text())
        broker = next(m for m in state["processes"] if m["kind"] == "broker")
        assert str(secret_file.resolve()) in broker["args"]  # brokers get the secret file; bookies need none
        assert all(
            "--secret-file" not in m.get("args", []) for m in state["processes"] if m["kind"] == "bookie"
        )
        submit = procs.run(["submit", *where, "q", "x"], timeout=60)
        assert submit.returncode == 0, submit.stderr.decode()
        assert _dev(procs, "down", *where).returncode == 0

        # Again over the same directories, without flags: the config is kept (and so is the secret file).
        again = _dev(procs, "up", *where, "--cluster", "dv", "--bookies", "3", "--brokers", "1")
        assert again.returncode == 0, again.stderr.decode()
        assert f"already initialized (cluster id {config['cluster_id']})" in again.stdout.decode()
        assert _dev_config(dev_dir, "dv") == config
        assert _dev(procs, "down", *where).returncode == 0

        # With flags that disagree with the existing config: refused, naming the difference.
        other = _dev(
            procs,
            "up",
            *where,
            "--cluster",
            "dv",
            "--bookies",
            "0",
            "--brokers",
            "0",
            "--max-payload-bytes",
            "4096",
        )
        assert other.returncode == 1
        assert "max_payload_bytes: cluster has 2048" in _one_line(other)
    finally:
        _dev(procs, "down", *where)
