"""The zk_outage round of bench failover: its gap measure and its keys in the result."""

from __future__ import annotations

import pytest

from bench.failover_zk_outage import longest_ack_gap, zk_outage_result

pytestmark = pytest.mark.timeout(30)


def test_longest_ack_gap_counts_the_edges_of_the_outage():
    assert longest_ack_gap([], 10.0, 40.0) == 30.0  # nothing acknowledged: the whole outage
    assert longest_ack_gap([10.5, 11.0, 39.0], 10.0, 40.0) == pytest.approx(28.0)
    assert longest_ack_gap([9.0, 10.2, 10.4, 39.9, 41.0], 10.0, 40.0) == pytest.approx(29.5)
    assert longest_ack_gap([10.0 + i * 0.1 for i in range(301)], 10.0, 40.0) == pytest.approx(0.1)


def test_the_round_adds_its_keys_only_when_it_ran():
    assert zk_outage_result({}) == {}
    out = {"longest_gap_s": 0.08, "acks": 900, "tasks_acked": 18000, "leader_kept": True, "recovered_s": 1.2}
    result = zk_outage_result(out)
    assert result["zk_outage_longest_gap_s"] == 0.08 and result["zk_outage"] is out
