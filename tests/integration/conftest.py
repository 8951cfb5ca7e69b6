"""Fixtures shared by the integration tests."""

from __future__ import annotations

import pytest

from tests.support.bookie_client import Client


@pytest.fixture
def client_for():
    clients = []

    def make(address: str, timeout_ms: int = 5000) -> Client:
        clients.append(Client(address, timeout_ms))
        return clients[-1]

    yield make
    for c in clients:
        c.close()


# A test on Spark gets this long: its time includes the session's start (its first test) and a loaded
# machine stretches both. A timeout ends the whole worker process (pytest-timeout's thread method),
# with its processes left running, so it must be a last resort, not a likely event.
SPARK_TEST_TIMEOUT_S = 600


def pytest_collection_modifyitems(items):
    # With pytest-xdist (make test runs two workers), every test on Spark goes to the same worker,
    # so one session serves them all instead of one per worker.
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))
            item.add_marker(pytest.mark.timeout(SPARK_TEST_TIMEOUT_S), append=False)


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the whole run: starting one takes several seconds."""
    from pipeline.spark import spark_session

    session = spark_session(master="local[2]", app_name="fencepost-tests")
    yield session
    session.stop()
