"""A Client made while ZooKeeper drops its new session says "unavailable", not a raw kazoo error.

Seen in a chaos run: a worker restarted just as ZooKeeper was killed died of kazoo's
ConnectionLoss, which the callers (they retry on BrokerUnavailable) did not expect.
"""

from __future__ import annotations

import pytest
from kazoo.exceptions import ConnectionLoss

import broker.api.client_leader as client_leader
from broker.api.client import BrokerUnavailable, Client


class DroppingZooKeeper:
    """A session that was made, then lost before the first read answered."""

    closed = False

    def exists(self, _path):
        raise ConnectionLoss()

    def get_children(self, _path):
        raise ConnectionLoss()


def test_a_session_lost_during_the_first_read_is_broker_unavailable(monkeypatch):
    zk = DroppingZooKeeper()
    monkeypatch.setattr(client_leader, "zk_connect", lambda *_a, **_k: zk)
    monkeypatch.setattr(client_leader, "zk_close", lambda z: setattr(z, "closed", True))
    with pytest.raises(BrokerUnavailable, match="went away while connecting"):
        Client(zk="127.0.0.1:1", cluster="dev")
    assert zk.closed
