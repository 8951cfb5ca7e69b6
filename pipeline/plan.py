"""Which entries to read: the committed extent of each ledger of a shard's log, cut into read ranges.

Planning happens on the Spark driver (or the export's process): it reads the
log and each ledger's metadata, and for the last, still OPEN ledger its LAC,
so a range never reaches past what is committed. Each shard of a cluster has
its own log (shard 0's is the cluster's log of before shards); ledger ids are
unique over the cluster and grow along each log. The splitting itself is pure
(:func:`split_ranges`) and unit-tested without a cluster.

Example::

    with Connection.open(address) as conn:
        shards = conn.shards()                          # from the cluster's config: 1 unless it says
        extents = conn.extents(shard=2)                 # [LedgerExtent(ledger_id, epoch, last, shard=2), ...]
    ranges = split_ranges(extents, first=(7, 0), last=None, per_range=5000)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from election.cluster_config import cluster_shards, read_cluster_config, read_secret
from election.paths import ClusterPaths
from election.zk import close, connect
from ledger.client.facade import LedgerClient
from ledger.client.reader import LedgerReader
from ledger.log import read_log
from ledger.metadata import NoSuchLedger
from pipeline import PipelineError
from pipeline.rows import Position

DEFAULT_ENTRIES_PER_PARTITION = 1000


@dataclass(frozen=True)
class LedgerExtent:
    """A ledger of a shard's log and its last committed entry (-1: none yet).

    Example::

        LedgerExtent(ledger_id=7, epoch=3, last=41)    # entries 0..41 of ledger 7 (shard 0) are committed
    """

    ledger_id: int
    epoch: int
    last: int
    shard: int = 0


@dataclass(frozen=True)
class ReadRange:
    """Entries ``first..last`` (inclusive, all committed) of one ledger of ``shard``: one Spark partition's work.

    Example::

        ReadRange(ledger_id=7, epoch=3, first=0, last=999).entries    # 1000
    """

    ledger_id: int
    epoch: int
    first: int
    last: int
    shard: int = 0

    @property
    def entries(self) -> int:
        return self.last - self.first + 1


def split_ranges(
    extents: list[LedgerExtent], first: Position | None, last: Position | None, per_range: int
) -> list[ReadRange]:
    """The committed entries of one shard's log from ``first`` to ``last`` (both inclusive, None:
    unbounded), in log order, as ranges of at most ``per_range`` entries that never span two ledgers.

    Ledger ids grow along the log, so positions compare as tuples.
    """
    if per_range < 1:
        raise PipelineError(f"entries per partition must be at least 1, not {per_range}")
    out = []
    for ext in extents:
        lo = 0
        hi = ext.last
        if first is not None:
            if ext.ledger_id < first[0]:
                continue
            if ext.ledger_id == first[0]:
                lo = max(0, first[1])
        if last is not None:
            if ext.ledger_id > last[0]:
                break
            if ext.ledger_id == last[0]:
                hi = min(hi, last[1])
        for start in range(lo, hi + 1, per_range):
            out.append(ReadRange(ext.ledger_id, ext.epoch, start, min(hi, start + per_range - 1), ext.shard))
    return out


def shard_ranges(
    conn: "Connection",
    firsts: Mapping[int, Position | None],
    lasts: Mapping[int, Position | None],
    per_range: int,
) -> list[ReadRange]:
    """The read ranges of every shard in ``firsts`` (its first position, None: its log's start) up to
    its position in ``lasts`` (None: its committed end), shard after shard."""
    out = []
    for shard, first in sorted(firsts.items()):
        extents = conn.extents(from_ledger=None if first is None else first[0], shard=shard)
        out.extend(split_ranges(extents, first, lasts.get(shard), per_range))
    return out


def end_position(extents: list[LedgerExtent]) -> Position | None:
    """The last committed position of the log, or None if nothing is committed."""
    for ext in reversed(extents):
        if ext.last >= 0:
            return ext.ledger_id, ext.last
    return None


@dataclass(frozen=True)
class ClusterAddress:
    """Where the log is: ZooKeeper hosts, cluster name and (for hmac-sha256 digests) the secret file.

    Picklable, so it travels from the driver to the Spark workers, each of which
    opens its own connection.

    Example::

        address = ClusterAddress.from_options({"zk": "127.0.0.1:2181", "cluster": "dev"})
    """

    zk: str
    cluster: str
    secret_file: str | None = None
    read_timeout: float = 5.0

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "ClusterAddress":
        zk, cluster = options.get("zk"), options.get("cluster")
        if not zk or not cluster:
            raise PipelineError(
                "the fencepost source needs the options zk and cluster (or a path to an export)"
            )
        return cls(
            zk=zk,
            cluster=cluster,
            secret_file=options.get("secretFile") or None,
            read_timeout=float(options.get("readTimeout", 5.0)),
        )


class Connection:
    """A ZooKeeper session and a ledger client (its own bookie pool) on one cluster.

    Example::

        with Connection.open(address) as conn:
            for entry in conn.client.open_reader(7).read_range(0, 9): ...
    """

    def __init__(self, address: ClusterAddress) -> None:
        self.address = address
        self.zk = connect(address.zk, connect_timeout=10.0)
        try:
            self.paths = ClusterPaths(address.cluster)
            secret = read_secret(address.secret_file) if address.secret_file else None
            self.client = LedgerClient(self.zk, self.paths, secret=secret, read_timeout=address.read_timeout)
        except BaseException:
            close(self.zk)
            raise
        # One reader per ledger (with its shard) for the connection's life: a stream asks for the extents
        # on every trigger, and each new reader would arm another watch on the ledger's metadata.
        self._readers: dict[int, tuple[int, LedgerReader]] = {}
        self._shards: int | None = None  # fixed for the cluster's life: read once

    @classmethod
    def open(cls, address: ClusterAddress) -> "Connection":
        return cls(address)

    def shards(self) -> int:
        """How many shards the cluster has (its config's ``shards``; 1 when it does not say, or has no config)."""
        if self._shards is None:
            self._shards = cluster_shards(read_cluster_config(self.zk, self.paths) or {})
        return self._shards

    def extents(self, from_ledger: int | None = None, shard: int = 0) -> list[LedgerExtent]:
        """Every ledger of ``shard``'s log (from ``from_ledger`` on) with its last committed entry.

        A CLOSED ledger ends at its ``last_entry``; one still OPEN (the leader's,
        or a deposed leader's not yet recovered) at the LAC its bookies report.
        """
        try:
            return self._extents(from_ledger, shard)
        except NoSuchLedger:
            # Retention deleted a ledger after we listed the log: the log no longer names it.
            return self._extents(from_ledger, shard)

    def _extents(self, from_ledger: int | None, shard: int) -> list[LedgerExtent]:
        ledgers, _ = read_log(self.zk, self.paths.of_shard(shard))
        in_log = {item["id"] for item in ledgers}
        for gone in [i for i, (of, _) in self._readers.items() if of == shard and i not in in_log]:
            del self._readers[gone]
        out = []
        for item in ledgers:
            if from_ledger is not None and item["id"] < from_ledger:
                continue
            known = self._readers.get(item["id"])
            if known is None:
                known = self._readers[item["id"]] = (shard, self.client.open_reader(item["id"]))
            out.append(LedgerExtent(item["id"], item["epoch"], known[1].read_lac(), shard))
        return out

    def ledger_created_ms(self, ledger_ids: Iterable[int]) -> dict[int, int]:
        """When each ledger's metadata node was created, by ZooKeeper's clock (ms since the epoch).

        A wall-clock time the log itself lacks: events carry leader time, which
        a successor may continue from its predecessor's last stamp. A ledger
        already deleted is left out.
        """
        created = {}
        for ledger_id in ledger_ids:
            stat = self.zk.exists(self.paths.ledger(ledger_id))
            if stat is not None:
                created[ledger_id] = int(stat.ctime)
        return created

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            close(self.zk)

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
