"""The pure decisions about a store's place in the cluster's log, and moving a damaged store aside."""

from broker.server.store.guard import (
    DAMAGED_PREFIX,
    adoption_problem,
    position_problem,
    quarantine,
    state_dir_of,
)
from ledger.metadata import CLOSED, OPEN
from tests.support.clock import FakeClock

LOG = [{"id": 0, "epoch": 1}, {"id": 3, "epoch": 2}, {"id": 4, "epoch": 2}]
IDS = [x["id"] for x in LOG]


def test_positions_the_log_can_have_written_are_fine():
    assert position_problem(None, [], None) is None  # an empty store
    assert position_problem((3, 9), IDS, (CLOSED, 9)) is None  # at a closed ledger's end
    assert position_problem((4, 500), IDS, (OPEN, None)) is None  # the open ledger: its end is unknown
    assert position_problem((1, 0), IDS, None) is None  # a ledger that lost its CAS
    assert position_problem((0, 5), [3, 4], None) is None  # deleted by retention: a snapshot's job


def test_positions_beyond_the_log_are_named():
    assert "empty" in position_problem((0, 0), [], None)
    assert "ledger 7 is not in it; the last is 4" in position_problem((7, 0), IDS, None)
    assert "closed at entry 9" in position_problem((3, 10), IDS, (CLOSED, 9))


def test_adoption_needs_the_epoch_of_the_positions_ledger():
    assert adoption_problem(None, 0, LOG) is None
    assert adoption_problem((3, 2), 2, LOG) is None
    assert adoption_problem((3, 2), 0, LOG) is None  # no EpochStarted applied: nothing to compare
    assert "epoch 5 is not the epoch 2" in adoption_problem((4, 1), 5, LOG)


def test_quarantine_keeps_every_damaged_copy(tmp_path):
    for n in range(2):
        state = tmp_path / "state"
        state.mkdir()
        (state / "data.mdb").write_bytes(b"copy %d" % n)
        aside = quarantine(state, clock=FakeClock(wall_ms=1_700_000_000_000))
        assert not state.exists() and aside.name.startswith(DAMAGED_PREFIX + "20231114T221320Z")
    copies = sorted(p.name for p in tmp_path.iterdir())
    assert len(copies) == 2 and copies[1].endswith("-2")


def test_state_dir_of_a_data_dir_or_a_state_dir(tmp_path):
    (tmp_path / "state").mkdir()
    assert state_dir_of(tmp_path) == tmp_path / "state"
    (tmp_path / "state" / "data.mdb").write_bytes(b"")
    assert state_dir_of(tmp_path / "state") == tmp_path / "state"
