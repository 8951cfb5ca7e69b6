"""Helpers of the ledger tests: bookies started and registered, a ledger client, fake bookies, damage on disk."""

from __future__ import annotations

import json
import struct
import threading
import time

import lmdb
import zmq

from election import wire
from ledger.bookie.cookie import read_cookie
from ledger.client.bookie_errors import NoSuchEntry
from ledger.client.facade import LedgerClient
from ledger.codec import HEADER_SIZE
from tests.support.bookie_client import Client


def start_bookies(procs, cluster, n: int = 3) -> list:
    return procs.start_bookies(cluster, n)


def wait_registered(cluster, n: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (
            cluster.zk.exists(cluster.paths.bookies)
            and len(cluster.zk.get_children(cluster.paths.bookies)) >= n
        ):
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} bookies registered within {timeout}s")


def make_client(cluster, **kwargs) -> LedgerClient:
    kwargs.setdefault("add_timeout", 2.0)
    kwargs.setdefault("read_timeout", 1.0)
    kwargs.setdefault("request_timeout", 2.0)
    return LedgerClient(cluster.zk, cluster.paths, **kwargs)


def bookie_id_of(proc) -> str:
    return read_cookie(proc.data_dir)["bookie_id"]


def procs_in_ensemble_order(bookies: list, meta) -> list:
    by_id = {bookie_id_of(p): p for p in bookies}
    return [by_id[m["bookie_id"]] for m in meta.ensemble]


def corrupt_entry_on_disk(data_dir, ledger_id: int, entry_id: int) -> None:
    """Flip one payload byte of a stored entry (the bookie must be stopped)."""
    env = lmdb.open(str(data_dir), subdir=True, max_dbs=8, map_size=1 << 30)
    try:
        db = env.open_db(b"entries")
        key = struct.pack(">QQ", ledger_id, entry_id)
        with env.begin(write=True) as txn:
            data = bytearray(txn.get(key, db=db))
            data[HEADER_SIZE] ^= 0xFF
            txn.put(key, bytes(data), db=db)
    finally:
        env.close()


class FakeBookie:
    """A ROUTER socket in a thread; ``handler(msg) -> reply map or None (stay silent)``."""

    def __init__(self, handler):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.handler = handler
        self.stop = threading.Event()
        self.seen = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            if self.sock.poll(20):
                *env, body = self.sock.recv_multipart()
                msg = wire.decode(body)
                self.seen.append(msg)
                reply = self.handler(msg)
                if reply is not None:
                    self.sock.send_multipart([*env, wire.encode(reply)])
        self.sock.close()

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.ctx.term()


def by_id(bookies) -> dict:
    return {bookie_id_of(p): p for p in bookies}


def read_direct(address: str, ledger_id: int, entry_id: int) -> dict:
    return Client(address, timeout_ms=3000).call("read", ledger=ledger_id, entry=entry_id)


def register(cluster, fake: FakeBookie, bookie_id: str, free_gib: int = 10) -> None:
    doc = {"bookie_id": bookie_id, "address": fake.address, "free_bytes": free_gib << 30}
    cluster.zk.create(
        cluster.paths.bookie(bookie_id), json.dumps(doc).encode(), ephemeral=True, makepath=True
    )


def entries_seen(fake: FakeBookie) -> list[int]:
    ids = []
    for msg in list(fake.seen):
        if msg["op"] == "add_batch":
            ids.extend(range(msg["first"], msg["first"] + len(msg["entries"])))
    return ids


def holds_entries(client: LedgerClient, address: str, ledger_id: int, entry_ids) -> bool:
    """True if the bookie at ``address`` has a copy of each of ``entry_ids``.

    An add is acknowledged by the ack quorum: the other copies may still be on their way, so a test
    that damages or reads one bookie's copy waits for this first.
    """
    for entry_id in entry_ids:
        try:
            client.pool.request(address, "read", ledger=ledger_id, entry=entry_id).result(60)
        except NoSuchEntry:
            return False
    return True
