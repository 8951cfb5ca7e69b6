"""`fencepost bookie list` and the status additions, on plain dicts (no ZooKeeper)."""

from broker.admin.bookies import bookie_rows, format_bookie_list, human_bytes
from election.cluster_view import format_status, fragment_count, underreplicated_ids


def _member(bookie_id):
    return {"bookie_id": bookie_id, "address": f"tcp://h:{bookie_id[-1]}"}


LEDGERS = [
    {"id": 1, "fragments": [{"first_entry": 0, "ensemble": [_member("b1"), _member("b2"), _member("b3")]}]},
    # Ensemble change at entry 50: b3 swapped for b4.
    {
        "id": 2,
        "fragments": [
            {"first_entry": 0, "ensemble": [_member("b1"), _member("b2"), _member("b3")]},
            {"first_entry": 50, "ensemble": [_member("b1"), _member("b2"), _member("b4")]},
        ],
    },
    {"id": 3, "fragments": [{"first_entry": 0, "ensemble": [_member("b1"), _member("b2"), _member("b4")]}]},
]
REGISTERED = {
    "b1": {"address": "tcp://h:1", "free_bytes": 5 * 1024**3, "readonly": False},
    "b2": {"address": "tcp://h:2", "free_bytes": 1536, "readonly": True},
    "b4": {"address": "tcp://h:4", "free_bytes": 10, "readonly": False},
}


def test_human_bytes():
    assert human_bytes(0) == "0 B"
    assert human_bytes(1023) == "1023 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(5 * 1024**3) == "5.0 GiB"
    assert human_bytes(None) == "-" and human_bytes("x") == "-" and human_bytes(True) == "-"


def test_rows_count_ledgers_in_any_fragment_and_list_gone_bookies():
    rows = {r["id"]: r for r in bookie_rows(REGISTERED, LEDGERS, {})}
    assert [r["id"] for r in bookie_rows(REGISTERED, LEDGERS, {})] == ["b1", "b2", "b4", "b3"]
    assert rows["b1"]["ledgers_held"] == 3 and rows["b1"]["ledgers"] == [1, 2, 3]
    assert rows["b4"]["ledgers"] == [2, 3]
    assert rows["b2"]["readonly"] is True and rows["b2"]["free"] == "1.5 KiB"
    gone = rows["b3"]
    assert gone["state"] == "gone" and gone["ledgers"] == [1, 2] and gone["address"] == "tcp://h:3"
    assert gone["free_bytes"] is None and gone["free"] == "-"
    assert all(r["underreplicated"] == 0 for r in rows.values())
    assert {r["state"] for r in rows.values() if r["id"] != "b3"} == {"up"}


def test_underreplicated_counts_marked_ledgers_naming_or_holding_the_bookie():
    marks = {
        2: {"ledger_id": 2, "missing": [{"bookie_id": "b3", "from_entry": 40}]},
        # A mark naming a bookie no fragment holds any more (already swapped out everywhere).
        3: {"ledger_id": 3, "missing": [{"bookie_id": "b9", "from_entry": 0}]},
    }
    rows = {r["id"]: r for r in bookie_rows(REGISTERED, LEDGERS, marks)}
    assert rows["b1"]["underreplicated"] == 2 and rows["b1"]["underreplicated_ledgers"] == [2, 3]
    assert rows["b3"]["underreplicated_ledgers"] == [2]
    assert rows["b4"]["underreplicated_ledgers"] == [2, 3]
    assert rows["b9"]["state"] == "gone" and rows["b9"]["ledgers_held"] == 0
    assert rows["b9"]["underreplicated_ledgers"] == [3]


def test_format_bookie_list():
    text = format_bookie_list(bookie_rows(REGISTERED, LEDGERS, {2: {"missing": [{"bookie_id": "b3"}]}}))
    lines = text.splitlines()
    assert lines[0].split() == ["ID", "STATE", "ADDRESS", "FREE", "MODE", "LEDGERS", "UNDER-REPL"]
    assert lines[1].split() == ["b1", "up", "tcp://h:1", "5.0", "GiB", "writable", "3", "1"]
    assert lines[2].split()[5] == "read-only"
    assert lines[4].split() == ["b3", "gone", "tcp://h:3", "-", "-", "2", "1"]
    assert "no bookies" in format_bookie_list([])


def test_fragment_count_and_underreplicated_ids():
    assert fragment_count({"ensemble": [1], "fragments": [{}, {}]}) == 2
    assert fragment_count({"ensemble": [{"bookie_id": "b1"}]}) == 1  # written before fragments existed
    assert fragment_count({}) == 0
    assert underreplicated_ids(["L0000000012", "junk", "L0000000003"]) == [3, 12]


def test_format_status_shows_fragments_and_underreplicated_ledgers():
    view = {
        "initialized": True,
        "cluster": "c",
        "cluster_id": "x",
        "leader": 1,
        "epoch": 2,
        "brokers": [],
        "insync": [],
        "bookies": [],
        "queues": {},
        "ledgers": [
            {
                "id": 4,
                "state": "OPEN",
                "epoch": 2,
                "last_entry": 9,
                "ensemble": ["b1"],
                "fragments": 2,
                "underreplicated": True,
            }
        ],
        "underreplicated": {"count": 1, "ledgers": [4]},
    }
    text = format_status(view)
    assert "fragments=2" in text and "UNDER-REPLICATED" in text
    assert "under-replicated ledgers: 1 (L4;" in text
    view["underreplicated"] = {"count": 0, "ledgers": []}
    assert "under-replicated ledgers: 0" in format_status(view)
