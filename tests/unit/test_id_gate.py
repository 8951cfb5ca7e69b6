"""Broker ids while a cluster without a log starts (election/id_gate.py): the gate, and every
interleaving of kept members re-registering their ids with empty members applying for new ones.

The model follows election/identity.py step by step (each step one ZooKeeper operation:
GetNextBrokerId, the ApplyBrokerId multi-op, the re-registration of a kept id) and
broker/server/store/id_turn.py (present without an id, the gate, raising next_id). Every
reachable state is explored; the same model without the gate loses a kept id.
"""

from __future__ import annotations

import copy

import pytest

from election.id_gate import new_id_gate

pytestmark = pytest.mark.timeout(120)

MAX_TRIES = 20  # ensure_broker_id's max_tries


def test_gate_waits_for_every_member_then_floors_above_every_known_id():
    assert not new_id_gate([], newcomers=1, wait_for=3, registered_ids=[]).may_apply
    assert not new_id_gate([1], newcomers=1, wait_for=3, registered_ids=[1]).may_apply
    gate = new_id_gate([1, 2], newcomers=1, wait_for=3, registered_ids=[1, 2])
    assert gate.may_apply and gate.floor == 3
    # Ids brokers/ids held before count even when nobody reports them.
    assert new_id_gate([1], newcomers=1, wait_for=2, registered_ids=[1, 7]).floor == 8
    # After the decision: at once, above the decided members.
    gate = new_id_gate([], newcomers=1, wait_for=3, registered_ids=[], decided_members=[1, 2, 5])
    assert gate.may_apply and gate.floor == 6
    waiting = new_id_gate([2], newcomers=1, wait_for=3, registered_ids=[2])
    assert "waiting for 3 members (2 present)" in waiting.reason


# ---------------------------------------------------------------- the model


def _next_id(zk: dict) -> tuple[int, int]:
    """GetNextBrokerId (creating next_id = 1 when ZooKeeper lost it)."""
    if zk["next_id"] is None:
        zk["next_id"], zk["version"] = 1, 0
    return zk["next_id"], zk["version"]


def _apply(zk: dict, n: int, version: int, code: str) -> bool:
    """ApplyBrokerId: create ids/n and move next_id to n + 1, checked on next_id's version."""
    if n in zk["ids"] or zk["version"] != version:
        return False
    zk["ids"][n] = code
    zk["next_id"], zk["version"] = n + 1, version + 1
    return True


class Kept:
    """A broker whose .broker.meta names id ``k``: _register finds ids/k gone and re-registers it."""

    def __init__(self, k: int) -> None:
        self.k, self.code, self.pc, self.read = k, f"kept-{k}", "check", None

    def enabled(self, zk: dict, wait_for: int) -> bool:
        return self.pc != "done"

    def step(self, zk: dict, wait_for: int) -> None:
        k = self.k
        if self.pc == "check":
            held = zk["ids"].get(k)
            self.pc = "read" if held is None else ("publish" if held == self.code else "FAIL")
        elif self.pc == "read":
            self.read, self.pc = _next_id(zk), "apply"
        elif self.pc == "apply":
            n, version = self.read
            if n > k:
                zk["ids"].setdefault(k, self.code)
                self.pc = "verify"
            elif _apply(zk, k, version, self.code) or k in zk["ids"]:
                self.pc = "verify"
            else:
                self.pc = "read"
        elif self.pc == "verify":
            self.pc = "publish" if zk["ids"][k] == self.code else "FAIL"
        elif self.pc == "publish":
            zk["members"].add(k)
            self.pc = "done"

    def key(self) -> tuple:
        return ("K", self.k, self.pc, self.read)


class Newcomer:
    """An empty-disk broker: present without an id, through the gate (``gated``), then ensure_broker_id."""

    def __init__(self, name: str, gated: bool) -> None:
        self.code, self.gated = name, gated
        self.pc = "placeholder" if gated else "read"
        self.read = self.floor = self.got = None
        self.tries = 0

    def enabled(self, zk: dict, wait_for: int) -> bool:
        if self.pc == "gate":
            return new_id_gate(zk["members"], zk["newcomers"], wait_for, zk["ids"]).may_apply
        return self.pc != "done"

    def step(self, zk: dict, wait_for: int) -> None:
        if self.pc == "placeholder":
            zk["newcomers"] += 1
            self.pc = "gate"
        elif self.pc == "gate":
            self.floor = new_id_gate(zk["members"], zk["newcomers"], wait_for, zk["ids"]).floor
            self.pc = "raise_read"
        elif self.pc == "raise_read":  # raise_next_id: read, then CAS
            self.read = _next_id(zk)
            self.pc = "read" if self.read[0] >= self.floor else "raise_cas"
        elif self.pc == "raise_cas":
            if zk["version"] == self.read[1]:
                zk["next_id"], zk["version"] = self.floor, zk["version"] + 1
                self.pc = "read"
            else:
                self.pc = "raise_read"
        elif self.pc == "read":
            self.read, self.pc = _next_id(zk), "apply"
        elif self.pc == "apply":
            n, version = self.read
            self.tries += 1
            if _apply(zk, n, version, self.code):
                self.got, self.pc = n, "become"
            else:
                self.pc = "read" if self.tries < MAX_TRIES else "FAIL"
        elif self.pc == "become":  # init/members/new-<token> becomes init/members/<id> in one multi-op
            zk["newcomers"] -= 1 if self.gated else 0
            zk["members"].add(self.got)
            self.pc = "done"

    def key(self) -> tuple:
        return ("N", self.code, self.pc, self.read, self.floor, self.got, self.tries)


def _key(zk: dict, actors: list) -> tuple:
    return (
        zk["next_id"],
        zk["version"],
        tuple(sorted(zk["ids"].items())),
        tuple(sorted(zk["members"])),
        zk["newcomers"],
        tuple(a.key() for a in actors),
    )


def explore(kept_ids, newcomers: int, gated: bool, held_before=None):
    """Every terminal state (all done, or nobody can move) reachable from the start."""
    zk = {"next_id": None, "version": -1, "ids": dict(held_before or {}), "members": set(), "newcomers": 0}
    actors = [Kept(k) for k in kept_ids] + [Newcomer(f"new-{i}", gated) for i in range(newcomers)]
    wait_for = len(kept_ids) + newcomers
    seen, ends, stack = set(), [], [(zk, actors)]
    while stack:
        zk, actors = stack.pop()
        key = _key(zk, actors)
        if key in seen:
            continue
        seen.add(key)
        movable = [i for i, a in enumerate(actors) if a.pc != "FAIL" and a.enabled(zk, wait_for)]
        if not movable:
            ends.append((zk, actors))
            continue
        for i in movable:
            zk2, actors2 = copy.deepcopy((zk, actors))
            actors2[i].step(zk2, wait_for)
            stack.append((zk2, actors2))
    return ends, len(seen)


def problems(zk: dict, actors: list) -> list[str]:
    out = []
    for a in actors:
        if a.pc != "done":
            out.append(f"{a.key()} ended at {a.pc}")
    for a in actors:
        if isinstance(a, Kept) and zk["ids"].get(a.k) != a.code:
            out.append(f"kept id {a.k} is held by {zk['ids'].get(a.k)}")
    taken = [a.got for a in actors if isinstance(a, Newcomer) and a.got is not None]
    kept = {a.k for a in actors if isinstance(a, Kept)}
    if len(set(taken)) != len(taken) or kept & set(taken):
        out.append(f"new ids {taken} collide with each other or with kept ids {sorted(kept)}")
    return out


CASES = [
    ([1], 1, None),
    ([1, 2], 1, None),
    ([2], 1, None),
    ([1], 2, None),
    ([1, 3], 1, None),
    ([1], 1, {4: "before"}),  # brokers/ids held 4 before (a ZooKeeper restored from an old backup)
    ([1, 2], 1, {3: "before"}),
]


@pytest.mark.parametrize("kept_ids,newcomers,held_before", CASES)
def test_every_interleaving_keeps_each_kept_id_and_gives_newcomers_new_ones(kept_ids, newcomers, held_before):
    ends, states = explore(kept_ids, newcomers, gated=True, held_before=held_before)
    assert ends and states > 10
    for zk, actors in ends:
        assert problems(zk, actors) == [], (zk, [a.key() for a in actors])
        if held_before:
            taken = {a.got for a in actors if isinstance(a, Newcomer)}
            assert not taken & set(held_before)


@pytest.mark.parametrize("kept_ids,newcomers,held_before", [CASES[0], CASES[1], CASES[3], CASES[5]])
def test_without_the_gate_some_interleaving_takes_a_kept_id(kept_ids, newcomers, held_before):
    ends, _ = explore(kept_ids, newcomers, gated=False, held_before=held_before)
    assert any(problems(zk, actors) for zk, actors in ends)
