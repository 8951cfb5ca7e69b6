"""The documented import paths are plain modules: importing them from many threads at once never fails."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

# A fresh interpreter, so the first import really races.
RACE = """
import threading
errors = []
def load():
    try:
        from broker.client import Client
        from broker.worker import Worker
        from broker.aio import AsyncClient
        assert Client and Worker and AsyncClient
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=load) for _ in range(16)]
[t.start() for t in threads]
[t.join() for t in threads]
print(errors)
"""


def test_the_documented_names_are_the_api_classes():
    from broker.aio import AsyncClient
    from broker.api.aio import AsyncClient as api_async
    from broker.api.client import Client as api_client
    from broker.api.worker import Worker as api_worker
    from broker.client import Client
    from broker.worker import Worker

    assert (Client, Worker, AsyncClient) == (api_client, api_worker, api_async)


def test_importing_from_many_threads_at_once_never_fails():
    for _ in range(5):
        out = subprocess.run(
            [sys.executable, "-c", RACE], capture_output=True, text=True, timeout=60, check=True
        )
        assert out.stdout.strip() == "[]", out.stdout + out.stderr
