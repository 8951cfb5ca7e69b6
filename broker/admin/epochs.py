"""The epoch history (`fencepost admin epochs`), from the log and the ledgers.

Each epoch still in the log of a shard (shard 0 by default: each shard has its own epochs):
which ledgers it wrote, its first position, and, from the ``EpochStarted`` entry that opens
its first ledger, the broker that led it and when it started.

Example::

    for row in epoch_history(zk, "dev"):
        print(row["epoch"], row["broker_id"], row["first_position"], row["started_at"])
    epoch_history(zk, "dev", shard=2)
"""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from broker.state.events import BadEvent, decode_batch
from election.leader import read_epoch
from election.shard_view import shard_paths
from ledger import LedgerError
from ledger.client.facade import LedgerClient
from ledger.log import read_log
from ledger.metadata import read_metadata


def epoch_history(zk: KazooClient, cluster: str, secret: bytes | None = None, shard: int = 0) -> list[dict]:
    """Each epoch still in the log of ``shard``: its leader broker id, first position and start time.

    Read from the log (which ledgers each epoch wrote) and the first entry of each epoch's
    first ledger (``EpochStarted``, naming the broker); when that entry cannot be read the
    ledger's creation time stands in and the broker id is the epoch node's, if current.
    """
    paths = shard_paths(zk, cluster, shard)
    ledgers, _ = read_log(zk, paths)
    current, _ = read_epoch(zk, paths)
    history: dict[int, dict] = {}
    for entry in ledgers:
        row = history.setdefault(entry["epoch"], {"epoch": entry["epoch"], "ledgers": []})
        row["ledgers"].append(entry["id"])
    with LedgerClient(zk, paths, secret=secret) as client:
        for row in history.values():
            first = row["ledgers"][0]
            row.update(first_position=[first, 0], broker_id=None, started_at=None)
            try:
                meta, _ = read_metadata(zk, paths, first)
                row["started_at"] = meta.created_at
                started = next(
                    (
                        e
                        for e in decode_batch(client.open_reader(first).read(0).payload)
                        if e.get("type") == "EpochStarted"
                    ),
                    None,
                )
            except (LedgerError, BadEvent, NoNodeError):
                started = None
            if started:
                row.update(broker_id=started["broker_id"], started_at=started["now_ms"] / 1000.0)
    if current and current not in history:  # claimed, but its ledger is not in the log yet
        history[current] = {
            "epoch": current,
            "ledgers": [],
            "first_position": None,
            "broker_id": None,
            "started_at": None,
        }
    return [history[epoch] for epoch in sorted(history)]
