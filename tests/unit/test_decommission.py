"""Decommissioning, the pure parts: what still names a bookie, who replaces it, when the leader rolls, the output."""

from __future__ import annotations

import random

from broker.admin.bookies import bookie_rows, format_bookie_list, format_progress
from broker.server.leading.roll_triggers import roll_reason
from ledger.metadata import CLOSED, OPEN, LedgerMetadata
from ledger.placement import placeable
from ledger.replication.decommission import DecommissionProgress, holding_fragments, split_remaining
from ledger.replication.plan import plan_rereplication


def m(i):
    return {"bookie_id": f"b{i}", "address": f"tcp://h{i}:1"}


def meta(ledger_id, fragments, state=CLOSED, last_entry=19):
    frags = [{"first_entry": f, "ensemble": [m(i) for i in ids]} for f, ids in fragments]
    return LedgerMetadata(
        ledger_id, frags[-1]["ensemble"], 3, 2, state, last_entry if state == CLOSED else -1, fragments=frags
    ).validate()


def test_holding_fragments_and_what_remains():
    a = meta(1, [(0, [1, 2, 3]), (10, [1, 2, 4])])
    b = meta(2, [(0, [2, 3, 4])])
    c = meta(3, [(0, [1, 3, 4])], state=OPEN)
    assert holding_fragments(a, "b3") == [0] and holding_fragments(a, "b1") == [0, 10]
    assert holding_fragments(b, "b1") == []
    assert split_remaining([a, b, c], "b3") == ([1, 2], [3])
    assert split_remaining([a, b, c], "b1") == ([1], [3])
    assert split_remaining([b], "b1") == ([], [])


def test_a_decommissioning_bookie_is_replaced_though_live_and_never_chosen():
    closed = meta(1, [(0, [1, 2, 3])])
    live = [{**m(i), "free_bytes": 10 << 30} for i in (1, 2, 3, 4)]
    live[0].update(readonly=True, decommissioning=True)  # what live_bookies lists for b1
    plan = plan_rereplication(closed, live, random.Random(1))
    assert [(r.lost["bookie_id"], r.replacement["bookie_id"]) for r in plan] == [("b1", "b4")]
    # Placement never counts it: a new ledger of 3 fits only on the other three.
    assert placeable(live) == 3


def test_the_leader_rolls_for_a_leaving_or_failed_member_or_after_a_change():
    assert roll_reason(0, [], ["b1", "b2", "b3"], set()) is None
    assert roll_reason(0, [], ["b1", "b2", "b3"], {"b9"}) is None
    assert "b2" in roll_reason(0, [], ["b1", "b2", "b3"], {"b2"})
    assert "failed" in roll_reason(0, ["b3"], ["b1", "b2", "b3"], set())
    assert "changed" in roll_reason(1, [], ["b1", "b2", "b4"], set())


def test_progress_lines_and_the_list_modes():
    p = DecommissionProgress("b3", total=4, closed=[7], waiting=[9], moved=[5, 6])
    line = format_progress(p.as_dict())
    assert line.startswith("decommissioning b3: 2/4 ledgers moved off it")
    assert "waiting for 1 open ledger(s) to close (9)" in line
    p.problems = {7: "no valid copy"}
    assert "retrying ledger 7: no valid copy" in format_progress(p.as_dict())
    done = DecommissionProgress("b3", total=4, moved=[5, 6, 7, 9])
    assert done.done and done.as_dict()["remaining"] == 0

    registered = {"b1": {"address": "tcp://h1:1"}, "b2": {"address": "tcp://h2:1"}}
    rows = bookie_rows(registered, [], {}, leaving={"b1": {"done": True}, "b2": {"started_at": 1.0}})
    assert [r["decommissioning"] for r in rows] == ["retired", "leaving"]
    text = format_bookie_list(rows)
    assert "retired" in text and "leaving" in text
