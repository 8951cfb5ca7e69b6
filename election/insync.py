"""Leader eligibility (docs/architecture.md, "Who may lead"; after RocketMQ RIP-44): the in-sync set and who may stand.

The pure rules come first and never touch ZooKeeper or a clock (the caller
passes ``now``): :func:`entries_behind` measures a follower's lag across
ledgers, :class:`CatchUpClock` decides who is in sync, :func:`may_stand` who
may stand for election. The I/O below them reads and writes the ``insync``
node (every write is one multi-op that also checks the ``epoch`` node's
version, so a stale leader's write fails) and the ``elect`` request node of
``fencepost admin elect``.

Example::

    clock = CatchUpClock(max_lag_entries=1000, max_time_not_caught_up=10.0)
    members = clock.members(leader_id=1, behind={2: 3, 3: 50_000}, previous_behind={2: 0, 3: 49_000},
                            learners=set(), now=12.5)   # -> {1, 2}
    ok, why = may_stand(3, learner=False, members={1, 2}, alive={2, 3}, allow_lagging=True)
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError

from election import ElectionError
from election.leader import LostLeadership
from election.paths import ClusterPaths

Position = tuple[int, int]


def entries_behind(
    position: Position | list | None,
    leader_position: Position | list | None,
    ledger_ids: list[int],
    last_entry: dict[int, int],
) -> int | None:
    """Entries between a follower's applied position and the leader's; None if it cannot be told.

    ``ledger_ids`` is the log in order, ``last_entry`` the last entry id of each closed ledger.
    A follower in a ledger no longer in the log (or whose length is unknown) counts as unknown,
    which the rules treat as lagging.
    """
    if not leader_position:
        return 0
    lead_ledger, lead_entry = leader_position
    if lead_ledger not in ledger_ids:
        return None
    lead_index = ledger_ids.index(lead_ledger)
    if position:
        ledger, entry = position
        if ledger not in ledger_ids:
            return None
        index = ledger_ids.index(ledger)
        if index > lead_index or (index == lead_index and entry >= lead_entry):
            return 0
    else:
        index, entry = 0, -1
        ledger = ledger_ids[0]
    if index == lead_index:
        return lead_entry - entry
    if ledger not in last_entry:
        return None
    total = last_entry[ledger] - entry
    for between in ledger_ids[index + 1 : lead_index]:
        if between not in last_entry:
            return None
        total += last_entry[between] + 1
    return total + lead_entry + 1


@dataclass
class CatchUpClock:
    """The leader's pure in-sync rule.

    A follower *caught up* when its position reached the leader's position of the previous
    check (``previous_behind == 0``). It is in sync while it is within ``max_lag_entries`` and
    caught up no longer than ``max_time_not_caught_up`` seconds ago. The leader is always in.
    """

    max_lag_entries: int
    max_time_not_caught_up: float

    def __post_init__(self) -> None:
        self.caught_up_at: dict[int, float] = {}

    def members(
        self,
        leader_id: int,
        behind: dict[int, int | None],
        previous_behind: dict[int, int | None],
        learners: set[int],
        now: float,
    ) -> set[int]:
        """The in-sync set given each live follower's lag now and against the previous check."""
        for broker_id in list(self.caught_up_at):
            if broker_id not in behind:
                del self.caught_up_at[broker_id]  # gone: it must catch up again when it returns
        out = {leader_id}
        for broker_id, lag in behind.items():
            if broker_id in learners or broker_id == leader_id:
                continue
            if previous_behind.get(broker_id) == 0 or lag == 0:
                self.caught_up_at[broker_id] = now
            caught = self.caught_up_at.get(broker_id)
            if (
                lag is not None
                and lag <= self.max_lag_entries
                and caught is not None
                and now - caught <= self.max_time_not_caught_up
            ):
                out.add(broker_id)
        return out


def may_stand(
    broker_id: int,
    learner: bool,
    members: set[int] | None,
    alive: set[int],
    allow_lagging: bool,
    elect_target: int | None = None,
) -> tuple[bool, str]:
    """Whether a broker may stand for election now, and why not.

    ``members`` is None before any leader wrote the set (a new cluster: anyone stands).
    """
    if learner:
        return False, "a learner never leads"
    if elect_target is not None and elect_target in alive:
        if broker_id == elect_target:
            return True, ""
        return False, f"leadership is being handed to broker {elect_target}"
    if members is None or broker_id in members:
        return True, ""
    if members & alive:
        return (
            False,
            f"not in the in-sync set {sorted(members)}, and members {sorted(members & alive)} are alive",
        )
    if allow_lagging:
        return True, ""
    return False, "no in-sync member is alive and allow_lagging_leader is off"


# ---------------------------------------------------------------- the insync node
def read_insync(zk: KazooClient, paths: ClusterPaths) -> tuple[dict | None, int]:
    """The ``insync`` document and its version; (None, -1) before any leader wrote it."""
    return _insync_of(zk.get_async(paths.insync), paths)


def _insync_of(pending, paths: ClusterPaths) -> tuple[dict | None, int]:
    try:
        data, stat = pending.get()
    except NoNodeError:
        return None, -1
    try:
        doc = json.loads(data)
    except ValueError:
        raise ElectionError(f"unreadable node {paths.insync}") from None
    return doc, stat.version


@dataclass(frozen=True)
class StandingInputs:
    """What the standing rules read: the ``insync`` document, the live broker ids, the ``elect`` request."""

    insync: dict | None
    alive: list[int]
    elect: dict | None


def read_standing_inputs(zk: KazooClient, paths: ClusterPaths, watch=None) -> StandingInputs:
    """The in-sync set, the live brokers and the elect request, read in about one round trip.

    Every request is sent before any answer is awaited (ZooKeeper answers a session's
    requests in order): a broker just elected checks these again before it claims an
    epoch, and each sequential read there is time without a leader. ``watch`` is armed on
    all three (on the nodes' existence, so it fires when a missing one appears).
    """
    armed = [zk.exists_async(path, watch=watch) for path in (paths.insync, paths.elect)] if watch else []
    insync = zk.get_async(paths.insync)
    children = zk.get_children_async(paths.live_brokers, watch=watch)
    elect = zk.get_async(paths.elect)
    for pending in armed:
        pending.get()
    try:
        alive = sorted(int(child) for child in children.get() if child.isdigit())
    except NoNodeError:
        if watch is not None:
            zk.exists(paths.live_brokers, watch=watch)
        alive = []
    return StandingInputs(_insync_of(insync, paths)[0], alive, _elect_of(elect))


def write_insync(zk: KazooClient, paths: ClusterPaths, members: set[int], leader_epoch: int) -> dict:
    """Replace the set, as the leader of ``leader_epoch``; LostLeadership if that epoch is stale.

    One multi-op checks the ``epoch`` node's version (as read here, holding our epoch) and the
    ``insync`` node's version, so a write from a leader whose epoch was claimed since fails.
    """
    for _ in range(10):
        data, epoch_stat = zk.get(paths.epoch)
        current = json.loads(data)
        current = int(current["epoch"] if isinstance(current, dict) else current)
        if current != leader_epoch:
            raise LostLeadership(
                f"epoch {current} was claimed after ours ({leader_epoch}): in-sync set not written"
            )
        doc, version = read_insync(zk, paths)
        if doc is not None and int(doc.get("leader_epoch", 0)) > leader_epoch:
            raise LostLeadership(
                f"the in-sync set belongs to epoch {doc['leader_epoch']} (ours is {leader_epoch})"
            )
        new = {
            "members": sorted(members),
            "insync_epoch": int((doc or {}).get("insync_epoch", 0)) + 1,
            "leader_epoch": leader_epoch,
        }
        txn = zk.transaction()
        txn.check(paths.epoch, epoch_stat.version)
        if version < 0:
            txn.create(paths.insync, json.dumps(new).encode())
        else:
            txn.set_data(paths.insync, json.dumps(new).encode(), version=version)
        results = txn.commit()
        if not any(isinstance(r, Exception) for r in results):
            return new
        if not any(
            isinstance(r, (BadVersionError, NodeExistsError, NoNodeError, RolledBackError)) for r in results
        ):
            raise ElectionError(f"writing the in-sync set: {results}")
    raise LostLeadership("could not write the in-sync set: it keeps changing")


def election_contenders(zk: KazooClient, paths: ClusterPaths) -> list[str]:
    """The broker ids queued in ``election/`` in queue order (the holder first), as strings."""
    try:
        children = zk.get_children(paths.election)
    except NoNodeError:
        return []
    out = []
    # kazoo's lock nodes end in a sequence number and hold the contender's identifier.
    for child in sorted(children, key=lambda name: name[-10:]):
        try:
            data, _ = zk.get(f"{paths.election}/{child}")
        except NoNodeError:
            continue
        out.append(data.decode("utf-8", "replace"))
    return out


# ---------------------------------------------------------------- the elect request
def read_elect(zk: KazooClient, paths: ClusterPaths) -> dict | None:
    """The pending ``admin elect`` request, or None."""
    return _elect_of(zk.get_async(paths.elect))


def _elect_of(pending) -> dict | None:
    try:
        data, _ = pending.get()
    except NoNodeError:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def request_elect(zk: KazooClient, paths: ClusterPaths, target: int, now: float) -> None:
    """Ask the leader to hand over to ``target``; ElectionError if another request is pending."""
    try:
        zk.create(paths.elect, json.dumps({"target": target, "requested_at": now}).encode(), makepath=True)
    except NodeExistsError:
        raise ElectionError(
            f"another elect request is pending ({read_elect(zk, paths)}); wait for it or delete it"
        ) from None


def answer_elect(zk: KazooClient, paths: ClusterPaths, refused: str) -> None:
    """The leader refuses the pending request with a reason (the requester reads and deletes it)."""
    doc = read_elect(zk, paths)
    if doc is not None and "refused" not in doc:
        try:
            zk.set(paths.elect, json.dumps({**doc, "refused": refused}).encode())
        except NoNodeError:
            pass


def clear_elect(zk: KazooClient, paths: ClusterPaths, target: int | None = None) -> None:
    """Delete the request (only if it names ``target``, when given)."""
    doc = read_elect(zk, paths)
    if doc is None or (target is not None and doc.get("target") != target):
        return
    try:
        zk.delete(paths.elect)
    except NoNodeError:
        pass
