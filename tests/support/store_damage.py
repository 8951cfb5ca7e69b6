"""Damage to a broker's LMDB store that the file format does not notice: a flipped payload byte."""

from __future__ import annotations

from pathlib import Path


def flip_payload_byte(data_dir: Path, marker: bytes) -> int:
    """Flip one byte inside every copy of the marked payload in the store's data.mdb (the LMDB file
    still opens: only a record's bytes change); how many copies."""
    path = Path(data_dir) / "state" / "data.mdb"
    data = bytearray(path.read_bytes())
    copies, at = 0, data.find(marker)
    while at >= 0:
        data[at + len(marker) // 2] ^= 0x20
        copies += 1
        at = data.find(marker, at + 1)
    path.write_bytes(bytes(data))
    return copies
