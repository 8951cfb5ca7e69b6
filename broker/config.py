"""Configuration of one broker process (`fencepost broker start`).

Example::

    config = load_settings(BrokerConfig, "broker", flags={"data": "b1", "listen": "tcp://127.0.0.1:5601"})
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from broker import BrokerError
from ledger.bookie_config import WILDCARD_HOSTS

_TCP = re.compile(r"\Atcp://[^:/\s]+:\d{1,5}\Z")


class BrokerConfigError(BrokerError):
    """A broker setting is missing or out of range."""


@dataclass
class BrokerConfig:
    """Every setting of a broker; see docs/configuration.md for each one's meaning."""

    data: str = "./broker-data"
    listen: str = "tcp://127.0.0.1:5601"
    zk: str = "127.0.0.1:2181"
    cluster: str = "dev"
    name: str = ""
    zk_session_timeout: float = 10.0
    learner: bool = False
    secret_file: str = ""
    max_frame_bytes: int = 8 * 1024 * 1024
    max_batch_events: int = 2000
    max_inflight_entries: int = 8
    tick_ms: int = 50
    lease_check_ms: int = 200
    digest_every_entries: int = 200
    default_lease_ms: int = 30_000
    live_update_ms: int = 500
    map_size: int = 16 * 1024 ** 3
    fsync: bool = True
    checkpoint_entries: int = 50_000
    checkpoint_seconds: float = 600.0
    snapshots_kept: int = 3
    retention_seconds: float = 3600.0
    ledger_max_entries: int = 100_000
    ledger_max_bytes: int = 256 * 1024 * 1024
    shutdown_timeout: float = 10.0

    def validate(self) -> "BrokerConfig":
        if not _TCP.match(self.listen):
            raise BrokerConfigError(f"listen must look like tcp://HOST:PORT, got {self.listen!r}")
        if self.listen.removeprefix("tcp://").rsplit(":", 1)[0] in WILDCARD_HOSTS:
            raise BrokerConfigError(f"listen {self.listen!r} is also the address clients connect to: "
                                    "give a reachable host or IP, not a wildcard")
        if not 0.4 <= self.zk_session_timeout <= 120:
            raise BrokerConfigError("zk_session_timeout must be between 0.4 and 120 seconds")
        for name in ("max_batch_events", "max_inflight_entries", "tick_ms", "lease_check_ms",
                     "digest_every_entries", "default_lease_ms", "live_update_ms"):
            if getattr(self, name) < 1:
                raise BrokerConfigError(f"{name} must be at least 1")
        for name in ("checkpoint_entries", "snapshots_kept", "ledger_max_entries", "ledger_max_bytes"):
            if getattr(self, name) < 1:
                raise BrokerConfigError(f"{name} must be at least 1")
        if self.checkpoint_seconds <= 0 or self.retention_seconds < 0:
            raise BrokerConfigError("checkpoint_seconds must be > 0 and retention_seconds >= 0")
        if not 1 <= self.shutdown_timeout <= 600:
            raise BrokerConfigError("shutdown_timeout must be between 1 and 600 seconds")
        if self.map_size < 1 << 20:
            raise BrokerConfigError("map_size must be at least 1 MiB")
        return self
