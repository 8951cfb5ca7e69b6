"""Fixtures shared by the integration tests."""
from __future__ import annotations

import pytest

from tests.integration.bookie_client import Client


@pytest.fixture
def client_for():
    clients = []

    def make(address: str, timeout_ms: int = 5000) -> Client:
        clients.append(Client(address, timeout_ms))
        return clients[-1]

    yield make
    for c in clients:
        c.close()


def pytest_collection_modifyitems(items):
    # With pytest-xdist (make test runs two workers), every test on Spark goes to the same worker,
    # so one session serves them all instead of one per worker.
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the whole run: starting one takes several seconds."""
    from pipeline.spark import spark_session

    session = spark_session(master="local[2]", app_name="fencepost-tests")
    yield session
    session.stop()
