"""Snapshot download without sockets: a fake request() in front of a real catalog."""

from __future__ import annotations

import json
import os

import pytest

from snapshots import SnapshotError
from snapshots.catalog import SnapshotCatalog, snapshot_name
from snapshots.format import SnapshotCorrupt, WrongCluster
from snapshots.reader import verify_snapshot
from snapshots.transfer import MAX_CHUNK, TransferError, describe, download, read_chunk
from snapshots.writer import write_snapshot


def records(n):
    # Incompressible payloads so the file spans several chunks.
    return [("payloads", f"t{i:06d}".encode(), os.urandom(300)) for i in range(n)]


def make_snapshot(catalog, position=(5, 9), cluster="dev", n=2000):
    catalog.dir.mkdir(parents=True, exist_ok=True)
    header = {
        "cluster_id": cluster,
        "broker_id": 2,
        "position": list(position),
        "epoch": 3,
        "created_at": 10.0,
        "digest": "ab" * 16,
    }
    return write_snapshot(catalog.dir / snapshot_name(position), header, records(n))


class Server:
    """request(op, fields) over a catalog, as the broker would answer it."""

    def __init__(self, catalog, cut_after=None, corrupt_chunk=None):
        self.catalog = catalog
        self.cut_after = cut_after  # raise after this many chunks
        self.corrupt_chunk = corrupt_chunk  # flip a byte in this chunk (crc unchanged)
        self.chunks = 0
        self.bytes = 0
        self.ops = []

    def __call__(self, op, fields):
        self.ops.append(op)
        if op == "snapshot_info":
            return {"ok": True, "snapshot": describe(self.catalog)}
        assert op == "snapshot_chunk" and set(fields) == {"name", "offset", "length"}
        if self.cut_after is not None and self.chunks >= self.cut_after:
            raise ConnectionError("connection reset by peer")
        reply = read_chunk(self.catalog, fields["name"], fields["offset"], fields["length"])
        if self.chunks == self.corrupt_chunk:
            data = bytearray(reply["data"])
            data[len(data) // 2] ^= 0x10
            reply["data"] = bytes(data)
        self.chunks += 1
        self.bytes += len(reply["data"])
        return dict(reply, ok=True)


@pytest.fixture
def catalog(tmp_path):
    return SnapshotCatalog(tmp_path / "server" / "snapshots")


@pytest.fixture
def dest(tmp_path):
    return tmp_path / "client" / "snapshots"


def test_describe(catalog):
    assert describe(catalog) is None
    info = make_snapshot(catalog)
    d = describe(catalog)
    assert d == {
        "name": "snap-0000000005-0000000009.fps",
        "size": info["size"],
        "checksum": info["checksum"],
        "position": [5, 9],
        "epoch": 3,
        "cluster_id": "dev",
        "digest": "ab" * 16,
        "created_at": 10.0,
        "record_count": 2000,
    }


def test_download_whole(catalog, dest):
    info = make_snapshot(catalog)
    seen = []
    server = Server(catalog)
    path = download(
        server,
        dest,
        progress=lambda done, total: seen.append((done, total)),
        chunk=64 << 10,
        cluster_id="dev",
    )
    assert path == dest / "snap-0000000005-0000000009.fps"
    assert path.read_bytes() == (catalog.dir / path.name).read_bytes()
    assert verify_snapshot(path, "dev")["checksum"] == info["checksum"]
    assert seen[-1] == (info["size"], info["size"]) and len(seen) == server.chunks > 3
    assert sorted(os.listdir(dest)) == [path.name]  # no .part or sidecar left
    # Already there: nothing is fetched again.
    again = Server(catalog)
    assert download(again, dest, cluster_id="dev") == path and again.chunks == 0


def test_cut_connection_resumes_where_it_stopped(catalog, dest):
    info = make_snapshot(catalog)
    chunk = 32 << 10
    first = Server(catalog, cut_after=5)
    with pytest.raises(ConnectionError):
        download(first, dest, chunk=chunk)
    part = dest / "snap-0000000005-0000000009.fps.part"
    assert part.stat().st_size == 5 * chunk
    assert json.loads((dest / (part.name + ".json")).read_text())["size"] == info["size"]
    assert not (dest / "snap-0000000005-0000000009.fps").exists()

    second = Server(catalog)
    path = download(second, dest, chunk=chunk)
    assert second.bytes == info["size"] - 5 * chunk  # only the rest was fetched
    assert verify_snapshot(path)["checksum"] == info["checksum"]
    assert sorted(os.listdir(dest)) == [path.name]


def test_cut_repeatedly(catalog, dest):
    info = make_snapshot(catalog)
    total = 0
    for _ in range(100):
        server = Server(catalog, cut_after=2)
        try:
            path = download(server, dest, chunk=50_000)
            break
        except ConnectionError:
            pass
        finally:
            total += server.bytes
    assert total == info["size"]
    assert verify_snapshot(path)["checksum"] == info["checksum"]


def test_corrupted_chunk_is_refused_and_the_next_try_completes(catalog, dest):
    info = make_snapshot(catalog)
    chunk = 32 << 10
    with pytest.raises(TransferError, match="fails its crc") as exc:
        download(Server(catalog, corrupt_chunk=3), dest, chunk=chunk)
    assert exc.value.code == "bad_chunk"
    part = dest / "snap-0000000005-0000000009.fps.part"
    assert part.stat().st_size == 3 * chunk  # the bad chunk was never written
    path = download(Server(catalog), dest, chunk=chunk)
    assert verify_snapshot(path)["checksum"] == info["checksum"]


def test_wrong_cluster_is_refused_before_any_chunk(catalog, dest):
    make_snapshot(catalog, cluster="other")
    server = Server(catalog)
    with pytest.raises(WrongCluster, match="wrong cluster: snapshot is of other, this cluster is dev"):
        download(server, dest, cluster_id="dev")
    assert server.chunks == 0 and not any(dest.glob("*.part"))


def test_no_snapshot_offered(catalog, dest):
    with pytest.raises(TransferError) as exc:
        download(Server(catalog), dest)
    assert exc.value.code == "no_snapshot"


def test_a_newer_snapshot_restarts_the_download(catalog, dest):
    make_snapshot(catalog, position=(5, 9))
    with pytest.raises(ConnectionError):
        download(Server(catalog, cut_after=2), dest, chunk=10_000)
    make_snapshot(catalog, position=(6, 0))
    path = download(Server(catalog), dest, chunk=10_000)
    assert path.name == "snap-0000000006-0000000000.fps"
    assert sorted(os.listdir(dest)) == [path.name]  # the stale .part of (5, 9) is gone


def test_a_changed_file_behind_the_same_name_is_not_resumed(catalog, dest):
    make_snapshot(catalog)
    with pytest.raises(ConnectionError):
        download(Server(catalog, cut_after=2), dest, chunk=10_000)
    os.unlink(catalog.dir / "snap-0000000005-0000000009.fps")
    info = make_snapshot(catalog)  # same position, different bytes and checksum
    path = download(Server(catalog), dest, chunk=10_000)
    assert verify_snapshot(path)["checksum"] == info["checksum"]


def test_a_bad_part_file_is_caught_at_the_end_and_dropped(catalog, dest):
    info = make_snapshot(catalog)
    with pytest.raises(ConnectionError):
        download(Server(catalog, cut_after=2), dest, chunk=10_000)
    part = dest / "snap-0000000005-0000000009.fps.part"
    data = bytearray(part.read_bytes())
    data[-100] ^= 0xFF  # damaged at rest between the two tries
    part.write_bytes(data)
    with pytest.raises(SnapshotCorrupt):
        download(Server(catalog), dest, chunk=10_000)
    assert not part.exists()
    path = download(Server(catalog), dest, chunk=10_000)
    assert verify_snapshot(path)["checksum"] == info["checksum"]


# ---------------------------------------------------------------- server side checks


def test_read_chunk_refuses_paths_and_bad_numbers(catalog, tmp_path):
    info = make_snapshot(catalog)
    name = "snap-0000000005-0000000009.fps"
    (tmp_path / "server" / "secret.fps").write_bytes(b"secret")
    for bad in (
        "../secret.fps",
        "/etc/passwd",
        f"../snapshots/{name}",
        name + "/..",
        f"{name}.tmp",
        "",
        None,
        5,
        ["x"],
    ):
        with pytest.raises(TransferError) as exc:
            read_chunk(catalog, bad, 0, 10)
        assert exc.value.code == "bad_request"
    for offset, length in ((-1, 10), (0, -1), ("0", 10), (0, 1.5), (True, 3)):
        with pytest.raises(TransferError, match="bad_request"):
            read_chunk(catalog, name, offset, length)
    with pytest.raises(TransferError, match="past the end"):
        read_chunk(catalog, name, info["size"] + 1, 10)
    with pytest.raises(TransferError) as exc:
        read_chunk(catalog, "snap-0000000001-0000000001.fps", 0, 10)
    assert exc.value.code == "no_such_snapshot"
    big = read_chunk(catalog, name, 0, 1 << 30)
    assert len(big["data"]) == min(MAX_CHUNK, info["size"]) and big["size"] == info["size"]
    assert read_chunk(catalog, name, info["size"], 10)["data"] == b""
    tail = read_chunk(catalog, name, info["size"] - 7, 100)
    assert len(tail["data"]) == 7


def test_read_chunk_does_not_follow_symlinks(catalog, tmp_path):
    catalog.dir.mkdir(parents=True)
    target = tmp_path / "outside"
    target.write_bytes(b"not yours")
    os.symlink(target, catalog.dir / "snap-0000000001-0000000001.fps")
    with pytest.raises(TransferError):
        read_chunk(catalog, "snap-0000000001-0000000001.fps", 0, 10)


@pytest.mark.parametrize(
    "reply",
    [
        {"data": b"", "crc": 0},
        {"data": "text", "crc": 0},
        {"crc": 0},
        {"data": b"x" * 20, "crc": 0},  # more than asked for
    ],
)
def test_client_refuses_malformed_chunk_replies(catalog, dest, reply):
    make_snapshot(catalog, n=10)

    def request(op, fields):
        if op == "snapshot_info":
            return {"ok": True, "snapshot": describe(catalog)}
        return dict(reply, ok=True)

    with pytest.raises(TransferError):
        download(request, dest, chunk=10)


def test_client_refuses_malformed_info(dest):
    for snapshot in ({"name": "../../x"}, {"name": "x.fps", "size": 1}, "nope"):
        with pytest.raises(SnapshotError):
            download(lambda op, f, s=snapshot: {"ok": True, "snapshot": s}, dest)
