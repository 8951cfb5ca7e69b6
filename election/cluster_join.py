"""What a cluster does when it starts without a log but its members have stores
(docs/architecture.md, "Starting a cluster that has no log").

ZooKeeper holds no log for the cluster (its data was lost, or the cluster is new)
while the initial members report their stores. With I initial members, C clean,
D dirty, E empty and T transient (no store at all):

1. T + E = I: nothing survives; every member starts empty (``start_empty``).
2. Every non-empty store must carry the same initial signature (``cluster_id``,
   ``created_at``) and every clean store the same final signature (``shutdown_id``,
   ``position``); otherwise ``abort``, naming the members that disagree. A
   non-empty store without ``store.status`` has no signature and disagrees.
3. No clean store: ``abort`` with "manual recovery needed: run `fencepost store inspect`".
4. A dirty store newer than the clean ones (a later epoch, or the same epoch and a
   later position) also needs manual recovery: restoring from the clean stores would
   silently drop what the cluster did after their shutdown. (Added to the cluster-join design; a
   clean store goes stale when its broker stays down while the others run on.)
5. Else ``restore``: the clean stores are kept, the cluster restarts from their state
   (``source`` is the lowest clean member), and every other member takes its state
   from ``source``.

Everything here is pure: the caller gathers the reports and acts on the decision.

Example::

    members = [MemberStore(1, "clean", status_a, epoch=4), MemberStore(2, "transient", None)]
    d = decide_initialization(members, initial_members=2)
    d.action, d.source, d.take_state      # ("restore", 1, (2,))
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

from election.local.store_status import StoreStatus

TRANSIENT, EMPTY, CLEAN, DIRTY = "transient", "empty", "clean", "dirty"
KINDS = (TRANSIENT, EMPTY, CLEAN, DIRTY)
START_EMPTY, RESTORE, ABORT = "start_empty", "restore", "abort"
MANUAL_RECOVERY = "manual recovery needed: run `fencepost store inspect`"


@dataclass(frozen=True)
class MemberStore:
    """What one member reports about its store.

    ``status`` is its ``store.status`` (None for a transient member, and possibly for
    an empty store or one made before signatures existed); ``epoch`` and ``position``
    are what the store itself says it last applied (``position`` may be None when the
    caller does not know it; the final signature's position is in ``status``).
    ``label`` only decorates messages ("member 2 (./broker-2)").
    """

    member: int
    kind: str
    status: StoreStatus | None = None
    epoch: int = 0
    position: tuple[int, int] | None = None
    label: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"member {self.member}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}"
            )
        if self.kind == CLEAN and (self.status is None or not self.status.clean):
            raise ValueError(f"member {self.member}: a clean store needs a clean status")


@dataclass(frozen=True)
class InitDecision:
    """What the initial members do; ``keep`` and ``take_state`` are empty unless restoring."""

    action: str
    reason: str
    cluster_id: str | None = None
    source: int | None = None
    keep: tuple[int, ...] = ()
    take_state: tuple[int, ...] = ()
    epoch: int = 0


def classify_store(status: StoreStatus | None, store_exists: bool, store_empty: bool) -> str:
    """The kind of one member's store: transient, empty, clean or dirty.

    A store that holds nothing is empty whatever its status says; a non-empty one
    without a status (made before signatures) counts as dirty: nobody vouched for it.
    """
    if not store_exists:
        return TRANSIENT
    if store_empty:
        return EMPTY
    return CLEAN if status is not None and status.clean else DIRTY


def _name(m: MemberStore) -> str:
    return f"member {m.member} ({m.label})" if m.label else f"member {m.member}"


def _names(ms: Iterable[MemberStore]) -> str:
    ms = list(ms)
    if len(ms) == 1:
        return _name(ms[0])
    return "members " + ", ".join(f"{m.member} ({m.label})" if m.label else str(m.member) for m in ms)


def _split(ms: Sequence[MemberStore], key) -> list[tuple[Hashable, list[MemberStore]]]:
    """Members grouped by ``key``, the biggest group first (ties: lowest member first)."""
    groups: dict[Hashable, list[MemberStore]] = defaultdict(list)
    for m in ms:
        groups[key(m)].append(m)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0].member))


def _initial(m: MemberStore) -> str:
    if m.status is None:
        return "no store.status (its signatures are unknown)"
    return f"cluster {m.status.cluster_id} created at {m.status.created_at:.3f}"


def _final(m: MemberStore) -> str:
    pos = list(m.status.position) if m.status.position is not None else None
    return f"shutdown {m.status.shutdown_id} at {pos}"


def _disagreement(what: str, groups: list[tuple[Hashable, list[MemberStore]]], describe) -> str:
    return f"{what}: " + "; ".join(f"{_names(ms)}: {describe(ms[0])}" for _, ms in groups)


def _position_key(m: MemberStore) -> tuple[int, int] | None:
    if m.position is not None:
        return tuple(m.position)
    return m.status.position if m.status is not None and m.status.clean else None


def _newer(m: MemberStore, epoch: int, position: tuple[int, int] | None) -> bool:
    """True if ``m`` applied more than a store at ``(epoch, position)``. Epochs order
    stores across logs (a new log's epochs go above the old one's); positions only
    within one epoch, whose ledgers are all in one log."""
    if m.epoch != epoch:
        return m.epoch > epoch
    mine = _position_key(m)
    return mine is not None and position is not None and mine > position


def decide_initialization(members: Sequence[MemberStore], initial_members: int) -> InitDecision:
    """Decide how ``initial_members`` members with the given stores start without a log.

    ``members`` must be exactly the I initial members (the caller waits for them all);
    a different count or a repeated member id is a ValueError, not a decision.
    """
    ids = [m.member for m in members]
    if len(ids) != initial_members or len(set(ids)) != len(ids):
        raise ValueError(f"need the {initial_members} initial members once each, got members {sorted(ids)}")
    by_kind: dict[str, list[MemberStore]] = {
        k: sorted((m for m in members if m.kind == k), key=lambda m: m.member) for k in KINDS
    }
    clean, dirty = by_kind[CLEAN], by_kind[DIRTY]
    if not clean and not dirty:
        return InitDecision(
            START_EMPTY,
            f"no member has a non-empty store ({len(by_kind[TRANSIENT])} "
            f"without a store, {len(by_kind[EMPTY])} empty): all start empty",
        )
    stored = sorted(clean + dirty, key=lambda m: m.member)
    initial = _split(stored, lambda m: m.status.initial_signature if m.status is not None else None)
    if len(initial) > 1 or initial[0][0] is None:
        return InitDecision(ABORT, _disagreement("the stores are not of one cluster", initial, _initial))
    if not clean:
        return InitDecision(
            ABORT,
            f"{MANUAL_RECOVERY} (no store is clean: {_names(dirty)} "
            f"{'is' if len(dirty) == 1 else 'are'} dirty)",
        )
    final = _split(clean, lambda m: m.status.final_signature)
    if len(final) > 1:
        return InitDecision(
            ABORT, _disagreement("the clean stores stopped at different shutdowns", final, _final)
        )
    epoch = max(m.epoch for m in clean)
    top = max(clean, key=lambda m: (m.epoch, _position_key(m) or (-1, -1)))
    newer = [m for m in dirty if _newer(m, top.epoch, _position_key(top))]
    if newer:
        pos = _position_key(top)
        return InitDecision(
            ABORT,
            f"{MANUAL_RECOVERY} ({_names(newer)} applied more (epoch "
            f"{max(m.epoch for m in newer)}) than the clean stores (epoch {epoch}, "
            f"position {list(pos) if pos else None}): they are stale)",
        )
    keep = tuple(m.member for m in clean)
    takers = sorted((m for m in members if m.kind != CLEAN), key=lambda m: m.member)
    source = clean[0]
    then = (
        f"{_names(takers)} {'takes its' if len(takers) == 1 else 'take their'} state from it"
        if takers
        else "every member keeps its store"
    )
    return InitDecision(
        RESTORE,
        f"restoring from {_name(source)} ({_final(source)}, epoch {epoch}); {then}",
        cluster_id=source.status.cluster_id,
        source=source.member,
        keep=keep,
        take_state=tuple(m.member for m in takers),
        epoch=epoch,
    )
