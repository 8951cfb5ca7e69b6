"""The HTTP API in tests: API keys, a `fencepost api` process, and a keep-alive HTTP client over loopback.

Example::

    keys = api_keys(tmp_path / "api.keys", producer="shop", admin="ops")
    api = start_api(procs, bc, tmp_path / "api.keys")
    http = Http(api.address)
    status, doc, _ = http.request("POST", "/v1/queues/mail/tasks", {"payload": "hi"}, key=keys["producer"])
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

from devtools.procs import free_port
from election.secure.api_keys import add_api_key


def api_keys(path: Path, **names_by_role: str) -> dict[str, str]:
    """One API key per role (``producer="shop"``) added to the API keys file at ``path``: keys by role."""
    return {role: add_api_key(path, role, name) for role, name in names_by_role.items()}


def _answers(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        conn = http.client.HTTPConnection(host, int(port), timeout=1.0)
        conn.request("GET", "/openapi.json")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except (OSError, http.client.HTTPException):
        return False


def start_api(procs, bc, keys_file: Path, extra: list[str] | None = None, name: str = "api"):
    """A `fencepost api` process of the broker cluster ``bc`` on a free loopback port, once it answers."""
    address = f"127.0.0.1:{free_port()}"
    args = [
        "api",
        "--listen",
        address,
        "--api-keys-file",
        str(keys_file),
        "--zk",
        bc.zk_hosts,
        "--cluster",
        bc.cluster.name,
        *(extra or []),
    ]
    return procs.start(name, args, ready=lambda proc: _answers(proc.address), address=address)


class Http:
    """One keep-alive HTTP/1.1 connection to the API (opened again if the server closed it)."""

    def __init__(self, address: str, timeout: float = 60.0) -> None:
        self.host, port = address.rsplit(":", 1)
        self.port, self.timeout = int(port), timeout
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return self._conn

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        key: str | None = None,
        headers: dict | None = None,
        raw: bytes | None = None,
    ) -> tuple[int, Any, dict]:
        """``(status, JSON document or None, headers)``; ``raw`` sends those bytes as the body instead of ``body``."""
        sent = {**({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        if data is not None:
            sent.setdefault("Content-Type", "application/json")
        conn = self._connection()
        try:
            conn.request(method, path, body=data, headers=sent)
            response = conn.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if response.getheader("connection", "").lower() == "close":
            self.close()
        doc = json.loads(payload) if payload else None
        return response.status, doc, {k.lower(): v for k, v in response.getheaders()}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
