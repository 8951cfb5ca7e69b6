"""When a store can replay the log and when it must install a snapshot first."""
from broker.server.join import needs_snapshot


def test_empty_store_replays_while_history_is_complete():
    assert needs_snapshot(None, [0, 1, 2], log_truncated=False) is False


def test_empty_store_needs_a_snapshot_once_ledgers_were_deleted():
    assert needs_snapshot(None, [3, 4], log_truncated=True) is True


def test_store_inside_the_log_replays():
    assert needs_snapshot((3, 17), [3, 4], log_truncated=True) is False
    assert needs_snapshot((4, -1), [3, 4], log_truncated=True) is False


def test_store_behind_the_oldest_ledger_needs_a_snapshot():
    assert needs_snapshot((1, 99), [3, 4], log_truncated=True) is True
