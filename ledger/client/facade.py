"""The ledger client facade: one object for creating, reading, recovering and deleting ledgers.

It owns a :class:`~ledger.client.bookie_pool.BookiePool` (one I/O thread for all
bookie connections) and reads the cluster's quorum options and digest from the
``config`` znode unless given.

Example::

    client = LedgerClient(zk, ClusterPaths("dev"))
    writer = client.create(epoch=5)
    writer.add_sync(b"hello")
    writer.close()
    reader = client.open_reader(writer.ledger_id)
    assert reader.read(0).payload == b"hello"
    client.close()
"""

from __future__ import annotations

import logging
import random

import zmq
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError

from election.cluster_config import ClusterOptions, read_cluster_config
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from ledger import LedgerError
from ledger.client.bookie_pool import DEFAULT_TIMEOUT, BookiePool
from ledger.client.log_reader import LogReader
from ledger.client.reader import DEFAULT_READ_TIMEOUT, LedgerReader
from ledger.client.recovery import recover_and_close
from ledger.client.writer import DEFAULT_ADD_TIMEOUT, LedgerWriter, create_ledger
from ledger.codec import Digest
from ledger.log import START, Position
from ledger.metadata import (
    CLOSED,
    MetadataConflict,
    current_address,
    list_ledgers,
    live_bookies,
    read_metadata,
)

log = logging.getLogger(__name__)


class LedgerClient:
    """Create, read, recover and delete ledgers of one cluster.

    ``digest`` is a :class:`~ledger.codec.Digest`, a digest name, or None to
    use the cluster config's; ``secret`` keys ``hmac-sha256``. ``options``
    defaults to the quorum settings in the cluster config (or the defaults if
    the cluster has no config yet). ``clock`` is handed to every part that times
    out or stamps (the bookie pool, writers, readers, recovery).

    Example::

        with LedgerClient(zk, paths, secret=b"s3cret") as client:
            last = client.recover_and_close(ledger_id)
    """

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        digest: Digest | str | None = None,
        secret: bytes | None = None,
        options: ClusterOptions | None = None,
        context: zmq.Context | None = None,
        add_timeout: float = DEFAULT_ADD_TIMEOUT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        request_timeout: float = DEFAULT_TIMEOUT,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
    ) -> None:
        self.zk = zk
        self.paths = paths
        if options is None:
            config = read_cluster_config(zk, paths) or {}
            defaults = ClusterOptions()
            options = ClusterOptions(
                write_quorum=int(config.get("write_quorum", defaults.write_quorum)),
                ack_quorum=int(config.get("ack_quorum", defaults.ack_quorum)),
                ensemble_size=int(config.get("ensemble_size", defaults.ensemble_size)),
                digest=str(config.get("digest", defaults.digest)),
            )
        self.options = options
        if not isinstance(digest, Digest):
            digest = Digest.for_config(digest or options.digest, secret)
        self.digest = digest
        self.add_timeout = add_timeout
        self.read_timeout = read_timeout
        self._clock = clock
        self._rng = rng or random.Random()
        self.pool = BookiePool(context, default_timeout=request_timeout, clock=clock)

    # ------------------------------------------------------------- ledgers

    def create(self, epoch: int) -> LedgerWriter:
        """A new OPEN ledger on a random ensemble of live bookies, and its writer."""
        return create_ledger(
            self.zk,
            self.paths,
            self.pool,
            self.options,
            epoch,
            self.digest,
            clock=self._clock,
            rng=self._rng,
            add_timeout=self.add_timeout,
        )

    def open_reader(self, ledger_id: int) -> LedgerReader:
        """A reader of ``ledger_id`` (committed entries only)."""
        return LedgerReader(
            self.zk,
            self.paths,
            self.pool,
            ledger_id,
            self.digest,
            timeout=self.read_timeout,
            clock=self._clock,
        )

    def log_reader(self, after: Position = START) -> LogReader:
        """A reader of the whole log, from just after ``after``."""
        return LogReader(
            self.zk,
            self.paths,
            self.pool,
            self.digest,
            after=after,
            read_timeout=self.read_timeout,
            clock=self._clock,
        )

    def recover_and_close(self, ledger_id: int) -> int:
        """Fence and close ``ledger_id``; return its ``last_entry`` (idempotent)."""
        return recover_and_close(
            self.zk,
            self.paths,
            self.pool,
            ledger_id,
            self.digest,
            timeout=self.add_timeout,
            clock=self._clock,
        )

    def delete(self, ledger_id: int, force: bool = False) -> None:
        """Delete a CLOSED ledger from every bookie of any of its fragments, then its metadata.

        Every bookie must confirm, so that no copy is stranded without metadata
        pointing at it; ``force`` skips that check (and the CLOSED check) for
        ledgers whose bookies are gone for good. Deciding *whether* a ledger may
        go (it is covered by a servable snapshot) is the caller's job.
        """
        try:
            meta, version = read_metadata(self.zk, self.paths, ledger_id)
        except LedgerError:
            if force:
                return
            raise
        if meta.state != CLOSED and not force:
            raise LedgerError(f"ledger {ledger_id} is {meta.state}: only a CLOSED ledger may be deleted")
        members = meta.all_bookies()  # every fragment's: an ensemble change leaves copies on both sides
        futures = [
            self.pool.request(current_address(self.zk, self.paths, m), "delete", ledger=ledger_id)
            for m in members
        ]
        errors = []
        for member, fut in zip(members, futures):
            try:
                fut.result(self.pool.default_timeout + 1.0)
            except (LedgerError, TimeoutError) as exc:
                errors.append(f"{member['bookie_id']}: {exc}")
        if errors and not force:
            raise LedgerError(
                f"ledger {ledger_id}: delete failed on {len(errors)} bookie(s): {'; '.join(errors)}"
            )
        try:
            self.zk.delete(self.paths.ledger(ledger_id), version=version)
        except NoNodeError:
            pass
        except BadVersionError:
            raise MetadataConflict(f"ledger {ledger_id}: metadata changed while deleting") from None
        log.info("deleted ledger %d", ledger_id)

    def list_ledgers(self) -> list[int]:
        """Every ledger id with metadata, ascending."""
        return list_ledgers(self.zk, self.paths)

    def live_bookies(self) -> list[dict]:
        """The registrations (``bookie_id``, ``address``, ``free_bytes``) of the live bookies."""
        return live_bookies(self.zk, self.paths)

    # ------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Stop the bookie pool (fails whatever is still outstanding)."""
        self.pool.close()

    def __enter__(self) -> "LedgerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
