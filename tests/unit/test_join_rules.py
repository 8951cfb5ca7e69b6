"""When a store can replay the log and when it must install a snapshot first."""

from broker.server.store.join import needs_snapshot


def test_empty_store_replays_while_history_is_complete():
    assert needs_snapshot(None, [0, 1, 2], log_truncated=False) is False


def test_empty_store_needs_a_snapshot_once_ledgers_were_deleted():
    assert needs_snapshot(None, [3, 4], log_truncated=True) is True


def test_store_inside_the_log_replays():
    assert needs_snapshot((3, 17), [3, 4], log_truncated=True) is False
    assert needs_snapshot((4, -1), [3, 4], log_truncated=True) is False


def test_store_behind_the_oldest_ledger_needs_a_snapshot():
    assert needs_snapshot((1, 99), [3, 4], log_truncated=True) is True


def test_the_seed_of_a_re_created_log_replays_from_its_start():
    # Ledger 7 is gone with the old ZooKeeper data; the new log continues above it.
    assert needs_snapshot((7, 1042), [9], log_truncated=True, seed=(7, 1042)) is False
    assert needs_snapshot((7, 1041), [9], log_truncated=True, seed=(7, 1042)) is True


def test_resume_position_maps_only_the_seed_to_the_start():
    from ledger.log import START, position_after, resume_position

    assert resume_position((7, 1042), (7, 1042)) == START
    assert position_after(resume_position((7, 1042), (7, 1042)), [9, 12]) == (9, 0)
    assert resume_position((7, 1041), (7, 1042)) == (7, 1041)
    assert resume_position((9, 3), None) == (9, 3)


def test_the_seed_is_not_beyond_an_empty_or_newer_log():
    from broker.server.store.guard import position_problem

    assert position_problem((7, 1042), [], None, seed=(7, 1042)) is None
    assert position_problem((7, 1042), [9], None, seed=(7, 1042)) is None
    assert "beyond" in position_problem((7, 1042), [], None)
