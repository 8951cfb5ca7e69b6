"""Replaying the history into a fresh state store: what apply decided that the log alone does not say.

The log holds requests, not outcomes: a ``TaskLeased`` says "give worker W up
to N ready tasks of these queues" and apply picks them, so which task (and
which attempt of it) a lease handed out is known only by replaying the state.
:func:`replay` applies the entries, in log order, to a temporary
:class:`broker.state.store.StateStore` (the brokers' own store and apply, no
fsync, removed afterwards), from the start of the log or from a snapshot file,
and records:

* **lease grants**: one :class:`Grant` per task a ``TaskLeased`` handed out,
  ``(ledger_id, entry_id, event_index, task_id, attempt, worker, ts_ms, queue)``;
  :func:`grants_table` / :func:`grants_dataframe` give them to Arrow and Spark;
* **digest checks**: at every ``StateDigest``, the replayed store's digest
  against the event's (:class:`DigestCheck`); a digest of another store format
  is not compared, as on a follower. A mismatch stops the replay there (the
  store, like a broker's, refuses to go on past a divergence);
* the replayed digest after any entry named in ``digests_at`` (to compare with
  a broker's reported digest at its position);
* and, for callers that need more (the audit), every entry's events and apply
  results through ``on_entry``; a result also names, as ``ended``, the tasks apply
  expired or an overflow dropped or dead-lettered in that event, which the broker's own
  results do not list (:mod:`pipeline.apply_watch`).

Entries come as ``(ledger_id, entry_id, epoch, payload)`` in log order, where
``payload`` is the entry's bytes or its already decoded events
(:mod:`pipeline.history` reads them from a cluster or an export directory).
Entries at or before the store's position (a snapshot's) are skipped.

Example::

    from pipeline.history import cluster_entries
    result = replay(cluster_entries(ClusterAddress("127.0.0.1:2181", "dev")))
    result.grants[0]                       # Grant(ledger_id=7, entry_id=3, event_index=0, task_id=..., ...)
    grants = grants_dataframe(spark, result.grants)
    [c for c in result.digest_checks if c.compared and not c.matches]
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

import pyarrow as pa

from broker.state.event_check import decode_entry
from broker.state.events import BadEvent
from broker.state.store import StateStore
from broker.state.store_errors import StoreError
from election.local.clock import SYSTEM_CLOCK, Clock
from election.wire.codes import E_DIGEST_MISMATCH
from pipeline import PipelineError
from pipeline.apply_watch import watching
from pipeline.rows import Position, format_position

# Events applied per store transaction: one commit per group, and the results of a
# group (a lease's results carry payloads) are what replay holds in memory at once.
GROUP_EVENTS = 50_000
# The store's LMDB map: virtual address space, the file only grows as the state does.
MAP_SIZE = 64 << 30


class UnreplayableEntry(PipelineError):
    """A committed entry that cannot be decoded or applied: the replay cannot go past it.

    Example::

        except UnreplayableEntry as exc:
            exc.position        # (7, 41)
    """

    def __init__(self, position: Position, message: str) -> None:
        super().__init__(message)
        self.position = position


class Grant(NamedTuple):
    """One task handed out by a ``TaskLeased`` event: its position, the task's attempt and worker.

    Example::

        Grant(ledger_id=7, entry_id=3, event_index=0, task_id="0a1b...", attempt=1, worker="w1",
              ts_ms=1764000000000, queue="mail")
    """

    ledger_id: int
    entry_id: int
    event_index: int
    task_id: str
    attempt: int
    worker: str
    ts_ms: int
    queue: str


GRANT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("ledger_id", "bigint"),
    ("entry_id", "bigint"),
    ("event_index", "int"),
    ("task_id", "string"),
    ("attempt", "bigint"),
    ("worker", "string"),
    ("ts_ms", "bigint"),
    ("queue", "string"),
)
GRANT_DDL = ", ".join(f"{name} {kind}" for name, kind in GRANT_COLUMNS)
GRANT_SCHEMA = pa.schema(
    [
        ("ledger_id", pa.int64()),
        ("entry_id", pa.int64()),
        ("event_index", pa.int32()),
        ("task_id", pa.string()),
        ("attempt", pa.int64()),
        ("worker", pa.string()),
        ("ts_ms", pa.int64()),
        ("queue", pa.string()),
    ]
)


@dataclass(frozen=True)
class DigestCheck:
    """A ``StateDigest`` event and the replayed store's digest at that point.

    ``compared`` is False for a digest of another store ``format`` (or when the
    replay cannot compare digests, from an export); ``matches`` is then None.

    Example::

        DigestCheck(ledger_id=7, entry_id=40, event_index=0, expected="9f..", actual="9f..", format=2,
                    compared=True, matches=True)
    """

    ledger_id: int
    entry_id: int
    event_index: int
    expected: str
    actual: str | None
    format: int | None
    compared: bool
    matches: bool | None


@dataclass
class ReplayResult:
    """What a replay found. ``start`` is the snapshot's position (None: from the log's start);
    ``last`` the last position applied; ``diverged`` the failed digest check that stopped it.

    Example::

        result.entries, result.events, result.last       # 1649, 820009, (7, 1648)
        result.digests_at[(7, 100)]                       # the replayed digest right after entry 7:100
    """

    grants: list[Grant] = field(default_factory=list)
    digest_checks: list[DigestCheck] = field(default_factory=list)
    digests_at: dict[Position, str] = field(default_factory=dict)
    start: Position | None = None
    last: Position | None = None
    entries: int = 0
    events: int = 0
    seconds: float = 0.0
    diverged: DigestCheck | None = None
    final_digest: str | None = None

    def grants_table(self) -> pa.Table:
        return grants_table(self.grants)


# (ledger_id, entry_id, epoch, [(event_index, event, result), ...]): every entry applied, in log order.
EntryObserver = Callable[[int, int, int, list[tuple[int, dict, dict]]], None]
Progress = Callable[[int, int, Position], None]


def grants_table(grants: Iterable[tuple]) -> pa.Table:
    """Lease grants (:class:`Grant` or tuples in its field order) as an Arrow table of :data:`GRANT_SCHEMA`."""
    columns = list(zip(*grants)) or [()] * len(GRANT_SCHEMA)
    return pa.Table.from_arrays(
        [pa.array(col, type=f.type) for col, f in zip(columns, GRANT_SCHEMA)], schema=GRANT_SCHEMA
    )


def grants_dataframe(spark, grants: Iterable[tuple]):
    """Lease grants as a Spark DataFrame with the columns of :data:`GRANT_DDL`."""
    table = grants_table(grants)
    if table.num_rows == 0:
        return spark.createDataFrame([], GRANT_DDL)
    return spark.createDataFrame(table, GRANT_DDL)


class _Replayer:
    """The store and the bookkeeping of one replay (see :func:`replay`)."""

    def __init__(
        self,
        store: StateStore,
        result: ReplayResult,
        digests_at: set[Position],
        on_entry: EntryObserver | None,
        progress: Progress | None,
        compare_digests: bool,
    ) -> None:
        self.store = store
        self.result = result
        self.digests_at = digests_at
        self.on_entry = on_entry
        self.progress = progress
        self.compare_digests = compare_digests
        self.applied = store.position()
        # (position, epoch, events applied, index in the entry of each applied event)
        self.group: list[tuple[Position, int, list[dict], list[int]]] = []
        self.size = 0

    def add(self, ledger_id: int, entry_id: int, epoch: int, payload) -> bool:
        """Queue one entry; False once the replay stopped at a divergence."""
        position = (ledger_id, entry_id)
        if self.applied is not None and position <= self.applied:
            return True
        events = payload if isinstance(payload, list) else _decode(position, payload)
        indexes = list(range(len(events)))
        if not self.compare_digests:
            # Without the real payloads (an export) the digests cannot agree: keep StateDigest out.
            for i, ev in enumerate(events):
                if ev["type"] == "StateDigest":
                    self._digest_check(position, i, ev, None)
            indexes = [i for i, ev in enumerate(events) if ev["type"] != "StateDigest"]
            events = [events[i] for i in indexes]
        self.group.append((position, epoch, events, indexes))
        self.applied = position
        self.size += len(events) or 1
        if self.size >= GROUP_EVENTS or position in self.digests_at:
            return self.flush()
        return True

    def flush(self) -> bool:
        group, self.group, self.size = self.group, [], 0
        if not group:
            return True
        try:
            results = self.store.apply_batches([(events, pos) for pos, _, events, _ in group], validated=True)
        except StoreError as exc:
            raise PipelineError(
                f"replay cannot apply entries {format_position(group[0][0])}.."
                f"{format_position(group[-1][0])}: {exc}"
            ) from None
        except Exception as exc:  # apply raised: nothing of the group was stored; name the entry
            if len(group) > 1:
                for one in group:
                    self.group = [one]
                    if not self.flush():
                        return False
                return True
            raise UnreplayableEntry(
                group[0][0],
                f"replay cannot apply the entry at {format_position(group[0][0])}: "
                f"{type(exc).__name__}: {exc}",
            ) from exc
        for (position, epoch, events, indexes), entry_results in zip(group, results):
            self._record(position, epoch, events, indexes, entry_results)
        if len(results) < len(group):
            return False  # stopped after the entry whose StateDigest failed
        last = group[-1][0]
        if last in self.digests_at:
            self.result.digests_at[last] = self.store.digest()
        if self.progress is not None:
            self.progress(self.result.entries, self.result.events, last)
        return True

    def _record(
        self, position: Position, epoch: int, events: list[dict], indexes: list[int], results: list[dict]
    ) -> None:
        result = self.result
        ledger_id, entry_id = position
        for i, ev, res in zip(indexes, events, results):
            kind = ev["type"]
            if kind == "TaskLeased" and res.get("ok"):
                worker, ts = ev["worker"], ev["now_ms"]
                result.grants.extend(
                    Grant(ledger_id, entry_id, i, t["task_id"], t["attempt"], worker, ts, t["queue"])
                    for t in res["tasks"]
                )
            elif kind == "StateDigest":
                check = self._digest_check(position, i, ev, res)
                if check.matches is False and result.diverged is None:
                    result.diverged = check
        result.entries += 1
        result.events += len(events)
        result.last = position
        if self.on_entry is not None:
            self.on_entry(ledger_id, entry_id, epoch, list(zip(indexes, events, results)))

    def _digest_check(self, position: Position, index: int, ev: dict, res: dict | None) -> DigestCheck:
        if res is None:
            check = DigestCheck(
                position[0], position[1], index, ev["digest"], None, ev.get("format"), False, None
            )
        else:
            mismatch = not res.get("ok") and res.get("error") == E_DIGEST_MISMATCH
            actual = res.get("actual") if mismatch else res.get("digest")
            compared = mismatch or (res.get("ok") and res.get("compared", True))
            check = DigestCheck(
                position[0],
                position[1],
                index,
                ev["digest"],
                actual,
                ev.get("format"),
                bool(compared),
                (not mismatch) if compared else None,
            )
        self.result.digest_checks.append(check)
        return check


def _decode(position: Position, payload: bytes) -> list[dict]:
    # A follower's decoding (each event by the compiled check of its layout): the same events and errors
    # as decode_batch, at less cost per event.
    try:
        return decode_entry(payload)
    except BadEvent as exc:
        raise UnreplayableEntry(
            position, f"entry {format_position(position)} cannot be decoded: {exc.message}"
        ) from None


def replay(
    entries: Iterable[tuple[int, int, int, bytes | list]],
    *,
    snapshot: Path | None = None,
    digests_at: Iterable[Position] = (),
    on_entry: EntryObserver | None = None,
    progress: Progress | None = None,
    compare_digests: bool = True,
    work_dir: Path | None = None,
    clock: Clock = SYSTEM_CLOCK,
    on_start: Callable[[StateStore], None] | None = None,
) -> ReplayResult:
    """Apply ``entries`` in log order to a fresh temporary store (loaded from ``snapshot`` first, if given).

    ``digests_at``: positions after whose entry the replayed digest is kept in
    :attr:`ReplayResult.digests_at`. ``on_entry(ledger_id, entry_id, epoch,
    items)`` sees every applied entry with apply's result per event
    (as ``(event_index, event, result)`` triples; from an export the
    ``StateDigest`` events are left out).
    ``progress(entries, events, position)`` is called after each store
    transaction. ``compare_digests`` False (an export's rebuilt events, whose
    payloads are not the real bytes) records every StateDigest uncompared.
    The temporary store lives under ``work_dir`` (default: the system's temp
    directory) and is removed at the end. :class:`UnreplayableEntry` for an
    entry that cannot be decoded or applied, :class:`~pipeline.PipelineError`
    for a snapshot that cannot be loaded or a store that fails. ``clock`` times the run
    (:attr:`ReplayResult.seconds`). ``on_start(store)`` sees the store before the first
    entry is applied (loaded from the snapshot, if any): what a caller needs of the state
    a replay starts from.
    """
    started = clock.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="fencepost-replay-", dir=work_dir))
    try:
        result = ReplayResult()
        if snapshot is not None:
            result.start = _load_snapshot(Path(snapshot), tmp / "state")
        # No fsync: the store is thrown away; a crash loses nothing that matters.
        store = StateStore(tmp / "state", map_size=MAP_SIZE, sync=False, sync_on_close=False)
        try:
            if on_start is not None:
                on_start(store)
            replayer = _Replayer(store, result, set(digests_at), on_entry, progress, compare_digests)
            with watching():  # results name the expiries and overflow drops apply decides (ENDED)
                for ledger_id, entry_id, epoch, payload in entries:
                    if not replayer.add(ledger_id, entry_id, epoch, payload):
                        break
                else:
                    replayer.flush()
            result.final_digest = store.digest()
        finally:
            store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result.seconds = clock.monotonic() - started
    return result


def _load_snapshot(path: Path, state_dir: Path) -> Position:
    """Load the snapshot file into the empty store at ``state_dir``; its position."""
    from broker.state.restore import restore_snapshot
    from snapshots import SnapshotError
    from snapshots.reader import read_header

    try:
        header = read_header(path)
        restored = restore_snapshot(path, state_dir, cluster_id=header["cluster_id"], map_size=MAP_SIZE)
    except (SnapshotError, StoreError, OSError) as exc:
        raise PipelineError(f"cannot replay from the snapshot {path}: {exc}") from None
    return int(restored["position"][0]), int(restored["position"][1])
