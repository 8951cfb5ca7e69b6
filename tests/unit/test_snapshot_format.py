"""The snapshot file format: round trips, damage of every kind, crash safety."""

from __future__ import annotations

import os
import re
import struct
import zlib

import pytest

from snapshots import SnapshotError
from snapshots import format as fmt
from snapshots import reader as snapshot_reader
from snapshots import writer as snapshot_writer
from snapshots.format import FOOTER_SIZE, MAGIC, SnapshotCorrupt, WrongCluster
from snapshots.reader import iter_records, read_header, verify_snapshot
from snapshots.writer import SnapshotBusy, cleanup_temp, write_snapshot

HEADER = {
    "cluster_id": "dev",
    "broker_id": 3,
    "position": [7, 41],
    "epoch": 2,
    "created_at": 1700000000.5,
    "digest": "0123456789abcdef" * 2,
}

# Every reason a damaged file may be reported with (N stands for a number).
REASONS = re.compile(
    r"\A(truncated|bad checksum|not a fencepost snapshot|bad block crc at offset \d+"
    r"|bad block length at offset \d+|bad block data at offset \d+|bad end marker at offset \d+"
    r"|bad record in block at offset \d+|bad header: .+|unsupported format version .+"
    r"|record count mismatch: .+|\d+ unexpected bytes before the footer)\Z"
)


def records(n, payload=20):
    return [
        (
            "tasks" if i % 2 else "payloads",
            f"task-{i:07d}".encode(),
            bytes((i * 7 + j) % 251 for j in range(payload + i % 13)),
        )
        for i in range(n)
    ]


def read_all(path):
    return list(iter_records(path))


@pytest.fixture
def small(tmp_path):
    """A snapshot of a few hundred bytes with several blocks."""
    path = tmp_path / "small.fps"
    old = snapshot_writer.BLOCK_TARGET
    snapshot_writer.BLOCK_TARGET = 200  # several blocks in a small file
    try:
        info = write_snapshot(path, HEADER, records(40, payload=8))
    finally:
        snapshot_writer.BLOCK_TARGET = old
    return path, info


def damaged(path, data):
    bad = path.with_name("bad.fps")
    bad.write_bytes(bytes(data))
    return bad


def block_offsets(data):
    """Offsets of the block headers in a snapshot file (parsed independently)."""
    (region,) = struct.unpack_from(">I", data, len(MAGIC))
    at, out = len(MAGIC) + 4 + region, []
    while True:
        length, _ = struct.unpack_from(">II", data, at)
        if length == 0:
            return out, at
        out.append(at)
        at += 8 + length


# ---------------------------------------------------------------- round trips


def test_round_trip_thousands_of_records(tmp_path):
    recs = records(20_000)
    recs.append(("payloads", b"big", os.urandom(3 << 20)))  # one record bigger than a block
    recs.append(("meta", b"empty", b""))
    path = tmp_path / "s.fps"
    info = write_snapshot(path, HEADER, recs)
    assert info["record_count"] == len(recs)
    assert info["size"] == path.stat().st_size
    assert info["format_version"] == 2 and info["compression"] == "zlib"
    assert read_all(path) == recs
    header = read_header(path)
    assert header == info
    assert verify_snapshot(path, cluster_id="dev") == info
    for key in HEADER:
        assert header[key] == HEADER[key]
    assert not os.path.exists(str(path) + ".tmp")


def test_empty_record_stream(tmp_path):
    path = tmp_path / "e.fps"
    info = write_snapshot(path, HEADER, iter(()))
    assert info["record_count"] == 0 and read_all(path) == []
    verify_snapshot(path)


def test_extra_header_keys_are_kept_and_tuples_accepted(tmp_path):
    path = tmp_path / "x.fps"
    write_snapshot(path, dict(HEADER, position=(7, 41), note="hi"), records(3))
    header = read_header(path)
    assert header["note"] == "hi" and header["position"] == [7, 41]


def test_memoryview_records_are_written_as_bytes(tmp_path):
    path = tmp_path / "m.fps"
    write_snapshot(path, HEADER, [("tasks", memoryview(b"k"), memoryview(b"v"))])
    assert read_all(path) == [("tasks", b"k", b"v")]


def test_layout_is_as_documented(tmp_path):
    path = tmp_path / "s.fps"
    info = write_snapshot(path, HEADER, records(100))
    data = path.read_bytes()
    assert data.startswith(b"FPSNAP01")
    magic, count, checksum = struct.unpack(">9sQI", data[-FOOTER_SIZE:])
    assert (magic, count, checksum) == (b"FPSNAPEND", 100, info["checksum"])
    assert fmt.crc32c(data[:-FOOTER_SIZE]) == checksum
    offsets, end = block_offsets(data)
    assert offsets and end + 8 == len(data) - FOOTER_SIZE
    for at in offsets:
        length, crc = struct.unpack_from(">II", data, at)
        assert fmt.crc32c(data[at + 8 : at + 8 + length]) == crc


# ---------------------------------------------------------------- bad input to the writer


@pytest.mark.parametrize(
    "change",
    [
        {"cluster_id": ""},
        {"position": [1]},
        {"position": [-1, 0]},
        {"epoch": -1},
        {"digest": "xyz"},
        {"created_at": "now"},
        {"broker_id": None},
    ],
)
def test_writer_refuses_bad_headers(tmp_path, change):
    with pytest.raises(SnapshotError, match="cannot write snapshot"):
        write_snapshot(tmp_path / "s.fps", dict(HEADER, **change), records(2))
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_missing_header_fields(tmp_path):
    header = dict(HEADER)
    del header["digest"]
    with pytest.raises(SnapshotError, match="lacks digest"):
        write_snapshot(tmp_path / "s.fps", header, [])


@pytest.mark.parametrize("bad", [("tasks", b"k"), (1, b"k", b"v"), ("tasks", "str", b"v")])
def test_writer_refuses_bad_records_and_leaves_nothing(tmp_path, bad):
    with pytest.raises(SnapshotError, match="bad snapshot record #2"):
        write_snapshot(tmp_path / "s.fps", HEADER, [*records(2), bad])
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- damage


def test_every_flipped_byte_is_detected(small):
    path, _ = small
    data = path.read_bytes()
    assert len(data) < 4000
    for i in range(len(data)):
        for bit in (0x01, 0x80):
            bad = bytearray(data)
            bad[i] ^= bit
            target = damaged(path, bad)
            with pytest.raises(SnapshotCorrupt) as exc:
                verify_snapshot(target)
            assert REASONS.match(exc.value.reason), (i, exc.value.reason)
            with pytest.raises(SnapshotCorrupt):
                read_all(target)


def test_flip_inside_a_block_names_that_block(small):
    path, _ = small
    data = path.read_bytes()
    offsets, _ = block_offsets(data)
    assert len(offsets) >= 3
    for at in offsets:
        bad = bytearray(data)
        bad[at + 12] ^= 0xFF  # inside the compressed bytes
        with pytest.raises(SnapshotCorrupt, match=f"bad block crc at offset {at}$"):
            verify_snapshot(damaged(path, bad))


def test_block_crc_is_checked_while_iterating(small):
    path, _ = small
    data = path.read_bytes()
    offsets, _ = block_offsets(data)
    bad = bytearray(data)
    bad[offsets[-1] + 12] ^= 0xFF
    seen = []
    with pytest.raises(SnapshotCorrupt, match="bad block crc"):
        for rec in iter_records(damaged(path, bad)):
            seen.append(rec)
    assert 0 < len(seen) < 40  # the good blocks before the bad one were yielded


def test_flipped_footer_checksum_is_bad_checksum(small):
    path, _ = small
    bad = bytearray(path.read_bytes())
    bad[-1] ^= 1
    with pytest.raises(SnapshotCorrupt) as exc:
        verify_snapshot(damaged(path, bad))
    assert exc.value.reason == "bad checksum"


def test_flipped_header_byte_is_caught_by_the_footer_checksum(small):
    path, _ = small
    data = path.read_bytes()
    i = data.index(b"dev") + 1  # "dev" -> "dfv": still a valid header
    bad = bytearray(data)
    bad[i] ^= 0x03
    with pytest.raises(SnapshotCorrupt) as exc:
        verify_snapshot(damaged(path, bad))
    assert exc.value.reason == "bad checksum"


def test_truncated_at_every_offset(small):
    path, _ = small
    data = path.read_bytes()
    for n in range(len(data)):
        with pytest.raises(SnapshotCorrupt) as exc:
            verify_snapshot(damaged(path, data[:n]))
        assert exc.value.reason == "truncated", n
        with pytest.raises(SnapshotCorrupt, match="truncated"):
            read_header(damaged(path, data[:n]))


def test_truncated_big_file_at_many_offsets(tmp_path):
    path = tmp_path / "s.fps"
    write_snapshot(path, HEADER, records(5000))
    data = path.read_bytes()
    for n in list(range(0, len(data), max(1, len(data) // 97))) + [len(data) - 1]:
        with pytest.raises(SnapshotCorrupt, match="truncated$"):
            verify_snapshot(damaged(path, data[:n]))


def test_trailing_bytes_are_refused(small):
    path, _ = small
    with pytest.raises(SnapshotCorrupt):
        verify_snapshot(damaged(path, path.read_bytes() + b"\0" * 30))


@pytest.mark.parametrize(
    "content", [b"", b"hello world, this is not a snapshot" * 3, b"FPSNAP02" + bytes(100), os.urandom(500)]
)
def test_other_files_are_not_snapshots(tmp_path, content):
    path = tmp_path / "other.fps"
    path.write_bytes(content)
    with pytest.raises(SnapshotCorrupt) as exc:
        verify_snapshot(path)
    assert exc.value.reason == ("truncated" if content == b"" else "not a fencepost snapshot")


def test_missing_file_is_a_snapshot_error(tmp_path):
    with pytest.raises(SnapshotError, match="cannot open"):
        verify_snapshot(tmp_path / "nope.fps")


def test_other_cluster_is_refused_after_integrity(small):
    path, _ = small
    with pytest.raises(WrongCluster) as exc:
        verify_snapshot(path, cluster_id="prod")
    assert exc.value.reason == "wrong cluster: snapshot is of dev, this cluster is prod"
    assert isinstance(exc.value, SnapshotCorrupt)
    verify_snapshot(path, cluster_id="dev")


def test_oversized_block_is_refused_without_decompressing_it(tmp_path, monkeypatch):
    path = tmp_path / "s.fps"
    write_snapshot(path, HEADER, [("payloads", b"k", bytes(50_000))])  # compresses very well
    monkeypatch.setattr(snapshot_reader, "MAX_BLOCK_RAW", 10_000)
    with pytest.raises(SnapshotCorrupt, match=r"bad block data at offset \d+"):
        verify_snapshot(path)


def test_block_length_beyond_bound_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "s.fps"
    write_snapshot(path, HEADER, records(500))
    monkeypatch.setattr(snapshot_reader, "MAX_BLOCK_COMPRESSED", 100)
    with pytest.raises(SnapshotCorrupt, match=r"bad block length at offset \d+"):
        verify_snapshot(path)


def test_well_framed_garbage_records_are_refused(tmp_path):
    """Valid CRCs around records that are not [str, bytes, bytes]: still refused."""
    raw = struct.pack(">I", 3) + b"\x93\x01\x02"  # [1, 2, ...] cut short
    comp = zlib.compress(raw)
    header = fmt.pack_header(dict(HEADER, format_version=1, compression="zlib", record_count=1))
    body = MAGIC + struct.pack(">I", len(header)) + header
    body += struct.pack(">II", len(comp), fmt.crc32c(comp)) + comp + struct.pack(">II", 0, 0)
    body += struct.pack(">9sQI", b"FPSNAPEND", 1, fmt.crc32c(body))
    path = tmp_path / "g.fps"
    path.write_bytes(body)
    with pytest.raises(SnapshotCorrupt, match="bad record in block"):
        verify_snapshot(path)


# ---------------------------------------------------------------- crash safety


def test_failure_while_writing_keeps_the_previous_snapshot(tmp_path):
    path = tmp_path / "s.fps"
    first = write_snapshot(path, HEADER, records(100))

    def exploding():
        yield from records(50)
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        write_snapshot(path, dict(HEADER, epoch=9), exploding())
    assert not os.path.exists(str(path) + ".tmp")
    assert verify_snapshot(path) == first


def test_crash_leftover_tmp_is_ignored_and_cleaned(tmp_path):
    path = tmp_path / "snap-0000000007-0000000041.fps"
    first = write_snapshot(path, HEADER, records(100))
    # A crash mid-write leaves a partial temp file (the rename never happened).
    tmp = tmp_path / (path.name + ".tmp")
    tmp.write_bytes(path.read_bytes()[:333])
    assert verify_snapshot(path) == first
    with pytest.raises(SnapshotBusy):
        write_snapshot(path, HEADER, records(1))
    assert tmp.exists() and verify_snapshot(path) == first  # the busy writer touched nothing
    (tmp_path / "unrelated.tmp").write_bytes(b"x")
    assert cleanup_temp(tmp_path) == [str(tmp)]
    assert not tmp.exists() and (tmp_path / "unrelated.tmp").exists()
    write_snapshot(path, dict(HEADER, epoch=5), records(1))
    assert read_header(path)["epoch"] == 5
    assert cleanup_temp(tmp_path / "missing") == []


def test_a_format_1_file_is_read_and_an_unknown_version_refused(tmp_path):
    """Version 1 has the same framing (its records are converted when restored); a later
    version is refused by name, never misread."""
    for version in (1, 3):
        header = fmt.pack_header(dict(HEADER, format_version=version, compression="zlib", record_count=0))
        body = MAGIC + struct.pack(">I", len(header)) + header + struct.pack(">II", 0, 0)
        body += struct.pack(">9sQI", b"FPSNAPEND", 0, fmt.crc32c(body))
        path = tmp_path / f"v{version}.fps"
        path.write_bytes(body)
        if version == 1:
            assert verify_snapshot(path)["format_version"] == 1
        else:
            with pytest.raises(SnapshotCorrupt, match="unsupported format version 3"):
                verify_snapshot(path)
