"""Every interleaving of brokers' takeover and roll steps, checked against the fencing invariants.

The brokers run the real decisions of :mod:`broker.server.standing.takeover_steps` (the
same generators the takeover and the roll drive against ZooKeeper) over an
in-memory model of ZooKeeper's CAS and multi-op semantics and of bookie
fencing. Each step is one atomic ZooKeeper or bookie operation; a session
expiry may strike between any two steps (the broker's ephemeral node goes, and
the broker, not knowing, goes on with a new session, as kazoo does). Checked:

(a) no entry is acknowledged in a ledger of epoch e once a ledger of a higher epoch is in the log;
(b) every acknowledged entry is read back by a reader from the start of the log;
(c) readers never block on an OPEN ledger of a dead epoch (only the last ledger may be OPEN);
(d) the `leader` node only ever holds the highest epoch published so far;
(e) no epoch is claimed while fewer bookies are live than a ledger needs (the takeover checks
    first, :func:`ready_to_claim`, and waits instead of burning an epoch);
(f) once the bookies are back, a waiting takeover completes: the highest epoch claimed is published;
(g) no two brokers have entries acknowledged in ledgers of one epoch;
(h) a new leader serves only once it applied every entry acknowledged in the log's ledgers of
    lower epochs: its catch-up after recovery, and a second one after its append only when the
    log changed in between (the takeover skips it otherwise).

A takeover need not wait for the old leader's session: a follower that suspects the leader
(:mod:`broker.server.standing.suspicion`) deletes its ``leader`` and election nodes if they still
name its session and epoch (:func:`unseat`), and the next broker in the election queue takes
over while the old leader may still be alive and writing. The queue is modelled too (a broker
takes over only once its node is first), and the suspecting followers' steps interleave with the
old leader's writes and with each other's.

The pre-fix decisions (an epoch read, then a log CAS checking only the log's
version; a `leader` node replaced whatever it held) are kept here as
``legacy`` programs, and the test asserts that the explorer catches them.
"""

from __future__ import annotations

import copy

import pytest

from broker.server.standing.suspicion import (
    DeleteNodes,
    ReadElectionNodes,
    ReadLeaderNode,
    Suspect,
    unseat,
)
from broker.server.standing.takeover_steps import (
    CONFLICT,
    STALE,
    WRITTEN,
    CountBookies,
    LedgerStates,
    ReadLog,
    RecoverAndClose,
    RecoveryShortfall,
    WaitingForBookies,
    WriteLog,
    append_fenced,
    close_previous,
    ready_to_claim,
)
from election.leader import EpochClaim, LostLeadership
from ledger import LedgerError
from ledger.log import appended

OPEN, CLOSED = "OPEN", "CLOSED"
ENSEMBLE = 3  # bookies a new ledger needs


class World:
    """ZooKeeper (epoch, log, leader nodes with versions and owners) and the bookies' ledgers."""

    def __init__(self) -> None:
        self.epoch, self.epoch_version = 0, -1
        self.log: list[dict] = []
        self.log_version = -1
        self.leader: tuple | None = None  # (epoch, owner session, version)
        self.ledgers: dict[int, list] = {}  # id -> [epoch, state, fenced, acked entries]
        self.next_ledger = 0
        self.sessions: dict[str, int] = {}
        self.published = 0
        self.acked: set = set()
        self.bookies = ENSEMBLE  # live bookies
        self.burned = 0  # epochs claimed whose ledger could not be created
        self.queue: list[tuple[str, int]] = []  # the election queue: (broker, owner session), first leads
        self.writers: dict[int, str] = {}  # epoch -> the broker whose entries were acknowledged in it
        self.violations: list[str] = []

    def key(self):
        return (
            self.epoch,
            self.epoch_version,
            tuple((x["id"], x["epoch"]) for x in self.log),
            self.log_version,
            self.leader,
            tuple(sorted((k, tuple(v)) for k, v in self.ledgers.items())),
            self.next_ledger,
            tuple(sorted(self.sessions.items())),
            self.published,
            tuple(sorted(self.acked)),
            self.bookies,
            self.burned,
            tuple(self.queue),
            tuple(sorted(self.writers.items())),
            tuple(self.violations),
        )

    # ---------------------------------------------------------------- ZooKeeper
    def claim(self) -> EpochClaim:
        self.epoch, self.epoch_version = self.epoch + 1, self.epoch_version + 1
        if self.bookies < ENSEMBLE:
            self.violations.append(
                f"(e) epoch {self.epoch} claimed with {self.bookies} of {ENSEMBLE} bookies live"
            )
        return EpochClaim(self.epoch, self.epoch_version)

    def write_log(self, ledgers, expected_version: int, claim: EpochClaim | None) -> str:
        """One multi-op: check the epoch version (if a claim is given), CAS the log."""
        if claim is not None and claim.version != self.epoch_version:
            return STALE
        if expected_version != self.log_version:
            return CONFLICT
        self.log, self.log_version = [dict(x) for x in ledgers], self.log_version + 1
        return WRITTEN

    def create_ledger(self, epoch: int) -> int | None:
        """None when too few bookies are live: the attempt ends and its epoch is burned."""
        if self.bookies < ENSEMBLE:
            self.burned += 1
            return None
        ledger_id, self.next_ledger = self.next_ledger, self.next_ledger + 1
        self.ledgers[ledger_id] = [epoch, OPEN, False, 0]
        return ledger_id

    def publish(self, broker: str, claim: EpochClaim) -> bool:
        """The fixed publish_leader: a multi-op checking our claim, replacing only a lower epoch."""
        if claim.version != self.epoch_version:
            return False
        session = self.sessions[broker]
        if self.leader is not None and self.leader[1] != session and self.leader[0] >= claim.epoch:
            return False
        self._set_leader(claim.epoch, session)
        return True

    def publish_legacy(self, broker: str, epoch: int) -> bool:
        """The pre-fix publish_leader: whatever node is there is deleted and ours created."""
        self._set_leader(epoch, self.sessions[broker])
        return True

    def _set_leader(self, epoch: int, session: int) -> None:
        version = 0 if self.leader is None else self.leader[2] + 1
        self.leader = (epoch, session, version)
        self.published = max(self.published, epoch)
        if epoch < self.published:
            self.violations.append(
                f"(d) leader node of epoch {epoch} after epoch {self.published} was published"
            )

    def expire(self, broker: str) -> None:
        old = self.sessions[broker]
        self.sessions[broker] = old + 10
        if self.leader is not None and self.leader[1] == old:
            self.leader = None
        if (broker, old) in self.queue:  # its election node goes; the candidacy stands again, last in line
            self.queue = [n for n in self.queue if n != (broker, old)] + [(broker, old + 10)]

    def delete_nodes(self, effect: DeleteNodes) -> bool:
        """The unseat multi-op: the leader node at its version and the named election nodes, or nothing."""
        names = {f"n{i}": node for i, node in enumerate(self.queue)}
        if self.leader is None or self.leader[2] != effect.leader_version:
            return False
        if any(name not in names for name, _ in effect.election):
            return False
        gone = {names[name] for name, _ in effect.election}
        self.leader = None
        self.queue = [n for n in self.queue if n not in gone]
        return True

    def first_in_line(self, broker: str) -> bool:
        return bool(self.queue) and self.queue[0][0] == broker

    # ---------------------------------------------------------------- bookies
    def add(self, ledger_id: int, broker: str = "") -> bool:
        epoch, state, fenced, count = self.ledgers[ledger_id]
        if fenced or state == CLOSED:
            return False
        self.ledgers[ledger_id][3] = count + 1
        self.acked.add((ledger_id, count))
        writer = self.writers.setdefault(epoch, broker)
        if writer != broker:
            self.violations.append(f"(g) brokers {writer} and {broker} both committed in epoch {epoch}")
        if any(x["epoch"] > epoch for x in self.log):
            self.violations.append(
                f"(a) entry {count} acknowledged in ledger {ledger_id} of epoch {epoch} "
                f"after a ledger of a higher epoch is in the log"
            )
        return True

    def close_own(self, ledger_id: int) -> bool:
        """The writer's own close: fails once the ledger is fenced."""
        entry = self.ledgers[ledger_id]
        if entry[2]:
            return False
        entry[1] = CLOSED
        return True

    def recover_and_close(self, ledger_id: int) -> int:
        entry = self.ledgers[ledger_id]
        entry[1], entry[2] = CLOSED, True
        return entry[3] - 1

    def enabled(self, action, broker: str = "") -> bool:
        """A broker waiting for bookies (out of the election) moves only once they are back; one waiting
        for its turn, once its election node is first."""
        if action == ("await_turn",):
            return self.first_in_line(broker)
        return action != ("await_bookies",) or self.bookies >= ENSEMBLE

    def perform(self, broker: str, action):
        if isinstance(action, ReadLeaderNode):
            if self.leader is None:
                return None
            epoch, owner, version = self.leader
            return {"epoch": epoch}, owner, version
        if isinstance(action, ReadElectionNodes):
            return [(f"n{i}", owner, 0) for i, (_, owner) in enumerate(self.queue)]
        if isinstance(action, DeleteNodes):
            return self.delete_nodes(action)
        if isinstance(action, CountBookies):
            return self.bookies
        if isinstance(action, RecoveryShortfall):
            return []  # the model's bookies are all up or too few for any ledger: the count decides
        if isinstance(action, ReadLog):
            return [dict(x) for x in self.log], self.log_version
        if isinstance(action, LedgerStates):
            return {i: self.ledgers[i][1] for i in action.ids}
        if isinstance(action, RecoverAndClose):
            return self.recover_and_close(action.ledger_id)
        if isinstance(action, WriteLog):
            return self.write_log(action.ledgers, action.expected_version, action.claim)
        kind, *args = action
        return {
            "claim": lambda: self.claim(),
            "create": lambda: self.create_ledger(*args),
            "publish": lambda: self.publish(broker, *args),
            "publish_legacy": lambda: self.publish_legacy(broker, *args),
            "add": lambda: self.add(*args, broker),
            "await_turn": lambda: None,
            "close": lambda: self.close_own(*args),
            "read_epoch": lambda: self.epoch,
            "await_bookies": lambda: None,
            "catch_up": lambda: self.readable(),
            "serving": lambda: self.serving(*args),
            "write_log_legacy": lambda: self.write_log(args[0], args[1], None),
        }[kind]()

    # ---------------------------------------------------------------- what a reader sees
    def readable(self) -> frozenset:
        """What a reader from the start of the log reads now (it blocks on an OPEN ledger that is not last)."""
        read = set()
        for item in self.log:
            _, state, _, count = self.ledgers[item["id"]]
            read.update((item["id"], i) for i in range(count))
            if state != CLOSED:
                break
        return frozenset(read)

    def serving(self, epoch: int, applied: frozenset) -> None:
        older = {x["id"] for x in self.log if x["epoch"] < epoch}
        missing = {e for e in self.acked if e[0] in older} - applied
        if missing:
            self.violations.append(f"(h) epoch {epoch} serves without acknowledged entries {sorted(missing)}")

    def check_state(self) -> None:
        for item in self.log[:-1]:
            if self.ledgers[item["id"]][1] != CLOSED:
                self.violations.append(
                    f"(c) ledger {item['id']} of epoch {item['epoch']} is OPEN before "
                    f"ledger {self.log[-1]['id']}: readers block on it"
                )

    def check_final(self) -> None:
        if self.bookies >= ENSEMBLE and self.published != self.epoch:
            self.violations.append(
                f"(f) bookies are back but epoch {self.epoch} was never published "
                f"(published {self.published}, {self.burned} epochs burned)"
            )
        read = set()
        for item in self.log:
            _, state, _, count = self.ledgers[item["id"]]
            read.update((item["id"], i) for i in range(count))
            if state != CLOSED and item is not self.log[-1]:
                break
        lost = self.acked - read
        if lost:
            self.violations.append(f"(b) acknowledged entries {sorted(lost)} are not read back from the log")


# -------------------------------------------------------------------- broker programs


def fixed_append(ledger_id: int, claim: EpochClaim):
    return (yield from append_fenced(ledger_id, claim))


def legacy_append(ledger_id: int, claim: EpochClaim):
    """The pre-fix open_ledger: read the log, check the epoch, then CAS the log on its version alone."""
    ledgers, version = yield ReadLog()
    if (yield ("read_epoch",)) != claim.epoch:
        raise LostLeadership("stale")
    outcome = yield ("write_log_legacy", appended(ledgers, ledger_id, claim.epoch), version)
    if outcome != WRITTEN:
        raise LostLeadership("lost CAS")


def old_leader_rolls(claim: EpochClaim, ledger_id: int, legacy: bool):
    """A leader of `claim` writing to `ledger_id`: one more entry, a roll, an entry in the new ledger."""
    try:
        if not (yield ("add", ledger_id)):
            return
        if not (yield ("close", ledger_id)):
            return
        new = yield ("create", claim.epoch)
        if new is None:
            return
        yield from (legacy_append if legacy else fixed_append)(new, claim)
        yield ("add", new)
    except (LostLeadership, LedgerError):  # LedgerError: the old log check refusing an older ledger id
        return


def old_leader_writes(claim: EpochClaim, ledger_id: int, adds: int):
    """A leader that was suspected but is alive (paused, slow): it goes on writing, then rolls."""
    for _ in range(adds - 1):
        if not (yield ("add", ledger_id)):
            return
    yield from old_leader_rolls(claim, ledger_id, legacy=False)


def suspects_and_takes_over(adds: int = 1):
    """A follower whose watch suspects the leader its leader node names now: it takes that leader's
    place in the election (the real unseat steps), then takes over once its own node is first."""
    node = yield ReadLeaderNode()
    if node is not None:
        info, owner, _version = node
        yield from unseat(Suspect(0, info["epoch"], owner))
    yield ("await_turn",)
    yield from takes_over(legacy=False, adds=adds)


def wait_for_bookies():
    """The takeover's check before its claim; short of bookies, out of the election until they return."""
    while True:
        try:
            return (yield from ready_to_claim(ENSEMBLE))
        except WaitingForBookies:
            yield ("await_bookies",)


def takes_over(legacy: bool, adds: int = 1, catch_up: bool = True):
    """A newly elected broker: check the bookies, claim, recover, open its ledger, publish, write."""
    try:
        if not legacy:
            yield from wait_for_bookies()
        claim = yield ("claim",)
        closed_at = yield from close_previous()
        applied = (yield ("catch_up",)) if catch_up else frozenset()
        new = yield ("create", claim.epoch)
        if new is None:
            return
        written = yield from (legacy_append if legacy else fixed_append)(new, claim)
        if not legacy:
            if catch_up and written - 1 != closed_at:  # the takeover's rule for a second catch-up
                applied = applied | (yield ("catch_up",))
            yield ("serving", claim.epoch, applied)
        published = yield (("publish_legacy", claim.epoch) if legacy else ("publish", claim))
        if not published:
            return
        for _ in range(adds):
            if not (yield ("add", new)):
                return
    except (LostLeadership, LedgerError):
        return


class Broker:
    """A program plus the results it was sent so far (a generator cannot be copied: it is replayed)."""

    def __init__(self, make, history=()) -> None:
        self.make, self.history = make, tuple(history)
        self.gen = make()
        self.pending = None
        self.done = False
        try:
            self.pending = next(self.gen)
            for result in self.history:
                self.pending = self.gen.send(result)
        except StopIteration:
            self.done = True

    def after(self, result) -> "Broker":
        return Broker(self.make, self.history + (result,))


class Explorer:
    """Depth-first over every interleaving, with state memoization; counts complete interleavings."""

    def __init__(self, expiries: int, returns: int = 0) -> None:
        self.expiries = expiries
        self.returns = returns  # how many times a lost bookie may come back
        self.memo: dict = {}
        self.violations: set[str] = set()
        self.states = 0

    def run(self, world: World, brokers: dict[str, Broker]) -> int:
        return self._explore(world, brokers, self.expiries, self.returns)

    def _explore(self, world: World, brokers: dict[str, Broker], expiries: int, returns: int) -> int:
        key = (
            world.key(),
            tuple((n, repr(b.history)) for n, b in sorted(brokers.items())),
            expiries,
            returns,
        )
        if key in self.memo:
            return self.memo[key]
        self.states += 1
        world.check_state()
        self.violations.update(world.violations)
        paths = 0
        live = [n for n, b in brokers.items() if not b.done and world.enabled(b.pending, n)]
        for name in live:
            nxt = copy.deepcopy(world)
            result = nxt.perform(name, brokers[name].pending)
            paths += self._explore(nxt, {**brokers, name: brokers[name].after(result)}, expiries, returns)
        if expiries and live:
            for name in brokers:
                nxt = copy.deepcopy(world)
                nxt.expire(name)
                paths += self._explore(nxt, brokers, expiries - 1, returns)
        if returns and world.bookies < ENSEMBLE:
            nxt = copy.deepcopy(world)
            nxt.bookies += 1
            live = live or ["a bookie came back"]
            paths += self._explore(nxt, brokers, expiries, returns - 1)
        if not live:
            world.check_final()
            self.violations.update(world.violations)
            paths = 1
        self.memo[key] = paths
        return paths


def old_leader_world(brokers: list[str]) -> tuple[World, EpochClaim, int]:
    """Epoch 1's leader `a` serves from ledger 0 (OPEN, one entry acknowledged), its leader node published."""
    world = World()
    for name in brokers:
        world.sessions[name] = len(world.sessions) + 1
    claim = world.claim()
    ledger = world.create_ledger(claim.epoch)
    assert world.write_log(appended([], ledger, claim.epoch), -1, claim) == WRITTEN
    assert world.publish("a", claim)
    assert world.add(ledger, "a")
    world.queue = [(name, world.sessions[name]) for name in brokers]  # `a` leads: its node is first
    return world, claim, ledger


def explore(brokers: dict, names: list[str], expiries: int) -> Explorer:
    world, claim, ledger = old_leader_world(names)
    explorer = Explorer(expiries)
    explorer.paths = explorer.run(
        world, {n: Broker(lambda make=make: make(claim, ledger)) for n, make in brokers.items()}
    )
    return explorer


def scenario(legacy: bool, three: bool):
    programs = {
        "a": lambda claim, ledger: old_leader_rolls(claim, ledger, legacy),
        "b": lambda claim, ledger: takes_over(legacy),
    }
    if three:
        programs["c"] = lambda claim, ledger: takes_over(legacy)
    return programs


@pytest.mark.parametrize("three, expiries", [(False, 2), (True, 0)], ids=["two-brokers", "three-brokers"])
def test_every_interleaving_keeps_the_fencing_invariants(three, expiries):
    programs = scenario(legacy=False, three=three)
    explorer = explore(programs, list(programs), expiries)
    print(
        f"{len(programs)} brokers, up to {expiries} session expiries: {explorer.paths} interleavings "
        f"explored ({explorer.states} distinct states)"
    )
    assert explorer.paths > 1000
    assert not explorer.violations, sorted(explorer.violations)[:5]


def test_the_pre_fix_logic_is_caught():
    """The old decisions (epoch read then a log CAS; publish replacing any node) break (a), (b), (c) and (d)."""
    programs = scenario(legacy=True, three=True)
    explorer = explore(programs, list(programs), expiries=0)
    found = {v[:3] for v in explorer.violations}
    print(f"pre-fix logic: {explorer.paths} interleavings, violations of {sorted(found)}")
    assert {"(a)", "(b)", "(c)", "(d)"} <= found


def test_a_takeover_that_serves_without_catching_up_is_caught():
    """(h) can fail: a successor that skips its catch-up serves without epoch 1's acknowledged entry."""
    programs = {
        "a": lambda claim, ledger: old_leader_rolls(claim, ledger, False),
        "b": lambda claim, ledger: takes_over(False, catch_up=False),
    }
    explorer = explore(programs, list(programs), expiries=0)
    assert any(v.startswith("(h)") for v in explorer.violations), sorted(explorer.violations)[:5]


def test_a_stale_append_is_refused_by_the_epoch_check():
    """The reproduction of the issue, as one schedule: the old leader's log change lands after epoch 2's claim."""
    world, claim, ledger = old_leader_world(["a", "b"])
    assert world.close_own(ledger)
    stale = world.create_ledger(claim.epoch)
    _, version = world.log, world.log_version
    world.claim()  # epoch 2, while `a` is paused between its epoch check and its log change
    assert world.write_log(appended(world.log, stale, claim.epoch), version, claim) == STALE
    assert world.write_log(appended(world.log, stale, claim.epoch), version, None) == WRITTEN  # the old CAS


def short_of_bookies(legacy: bool, three: bool, returns: int, expiries: int = 0) -> Explorer:
    """Epoch 1's leader `a` died after a bookie did: `b` (and `c`) take over with one bookie too few."""
    names = ["a", "b", "c"] if three else ["a", "b"]
    world, _claim, _ledger = old_leader_world(names)
    world.bookies = ENSEMBLE - 1
    explorer = Explorer(expiries, returns)
    explorer.paths = explorer.run(world, {n: Broker(lambda: takes_over(legacy)) for n in names[1:]})
    return explorer


@pytest.mark.parametrize("three", [False, True], ids=["one-taker", "two-takers"])
def test_a_takeover_short_of_bookies_claims_no_epoch_and_completes_once_they_return(three):
    """(e) and (f): no claim while short, whatever the interleaving; the takeover completes after the return."""
    for returns in (0, 1):
        explorer = short_of_bookies(legacy=False, three=three, returns=returns, expiries=1)
        print(
            f"short of bookies, {returns} return(s): {explorer.paths} interleavings ({explorer.states} states)"
        )
        assert not explorer.violations, sorted(explorer.violations)[:5]


def test_a_takeover_without_the_check_burns_epochs():
    """The pre-fix takeover claims first and fails to create its ledger: (e) and, with no retry, (f) break."""
    explorer = short_of_bookies(legacy=True, three=True, returns=1)
    found = {v[:3] for v in explorer.violations}
    assert {"(e)", "(f)"} <= found, sorted(explorer.violations)[:5]


def explore_suspicions(suspecting: int, old_adds: int, expiries: int = 0) -> Explorer:
    """Epoch 1's leader `a` alive and writing while `suspecting` followers suspect it at once."""
    names = ["a", "b", "c"][: suspecting + 1]
    world, claim, ledger = old_leader_world(names)
    programs = {"a": Broker(lambda: old_leader_writes(claim, ledger, old_adds))}
    for name in names[1:]:
        programs[name] = Broker(lambda: suspects_and_takes_over())
    explorer = Explorer(expiries)
    explorer.paths = explorer.run(world, programs)
    return explorer


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "suspecting, old_adds, expiries",
    [(1, 2, 1), (2, 1, 0)],
    ids=["one-follower-suspects-a-live-leader", "two-followers-suspect-at-once"],
)
def test_a_takeover_that_does_not_wait_for_the_old_session_keeps_the_invariants(
    suspecting, old_adds, expiries
):
    """The old leader is alive and writing while suspecting followers unseat it and take over:
    every interleaving keeps (a)-(d), (f) and (g): no acknowledged write lost, no two leaders
    committing in one epoch, the old leader's writes after the fence refused."""
    explorer = explore_suspicions(suspecting, old_adds, expiries)
    print(
        f"{suspecting} suspecting follower(s), old leader writing: {explorer.paths} interleavings "
        f"({explorer.states} states)"
    )
    assert explorer.paths > 1000
    assert not explorer.violations, sorted(explorer.violations)[:5]


@pytest.mark.timeout(60)
def test_the_unseated_leaders_write_after_the_fence_is_refused():
    """One schedule: `b` unseats the live leader `a`, takes over (fencing ledger 0), then `a` writes."""
    world, claim, ledger = old_leader_world(["a", "b"])
    b = Broker(lambda: suspects_and_takes_over(adds=0))
    while not b.done:
        assert world.enabled(b.pending, "b"), b.pending
        b = b.after(world.perform("b", b.pending))
    assert world.queue == [("b", world.sessions["b"])] and world.leader[0] == 2
    assert world.add(ledger, "a") is False  # fenced by b's recovery
    assert not world.violations


@pytest.mark.timeout(60)
def test_a_second_suspicion_of_the_old_leader_does_not_unseat_its_successor():
    """`c` suspected `a` too, but acts only after `b` leads: its unseat finds b's nodes and moves on."""
    world, _claim, _ledger = old_leader_world(["a", "b", "c"])
    epoch, owner, _ = world.leader
    b = Broker(lambda: suspects_and_takes_over(adds=0))
    while not b.done:
        b = b.after(world.perform("b", b.pending))
    steps = unseat(Suspect(0, epoch, owner))
    result = None
    try:
        while True:
            result = world.perform("c", steps.send(result))
    except StopIteration as done:
        assert done.value == "moved_on"
    assert world.leader is not None and world.leader[0] == 2 and world.first_in_line("b")
