"""Configuration of one broker process (`fencepost broker start`).

Example::

    config = load_settings(BrokerConfig, "broker", flags={"data": "b1", "listen": "tcp://127.0.0.1:5601"})
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from broker import BrokerError
from broker.state.events import MAX_SPAN_MS
from election import ElectionError
from election.cluster_config import cluster_option_field, init_if_missing_field, validate_member_options
from election.local.metrics_endpoint import parse_metrics_listen
from election.secure.keyring import check_secure_settings, key_file_field, keys_file_field
from ledger.bookie.config import WILDCARD_HOSTS

_TCP = re.compile(r"\Atcp://[^:/\s]+:\d{1,5}\Z")


class BrokerConfigError(BrokerError):
    """A broker setting is missing or out of range."""


@dataclass
class BrokerConfig:
    """Every setting of a broker; see docs/configuration.md for each one's meaning.

    The ``metadata`` of each field is its command-line option's help (``cli_options.py``
    generates ``broker start``'s options from these fields).
    """

    data: str = field(default="./broker-data", metadata={"help": "Data directory.", "path": "dir"})
    listen: str = field(
        default="tcp://127.0.0.1:5601", metadata={"help": "Address to serve clients on, tcp://HOST:PORT."}
    )
    metrics_listen: str = field(
        default="",
        metadata={
            "help": "Serve Prometheus metrics on http://HOST:PORT/metrics (docs/operations.md lists them); "
            "empty: off. Bind a loopback or private address: the endpoint has no authentication."
        },
    )
    zk: str = field(default="127.0.0.1:2181", metadata={"help": "ZooKeeper hosts host:port,..."})
    cluster: str = field(default="dev", metadata={"help": "Cluster name."})
    name: str = field(default="", metadata={"help": "Broker name.", "default_text": "the data dir's name"})
    zk_session_timeout: float = field(
        default=10.0, metadata={"help": "ZooKeeper session timeout in seconds; bounds failover time."}
    )
    learner: bool = field(
        default=False, metadata={"help": "Replicate only: never join the in-sync set nor lead."}
    )
    max_lag_entries: int = field(
        default=1000,
        metadata={
            "help": "A follower within this many entries of the leader may be in the in-sync set.",
            "min": 0,
        },
    )
    max_time_not_caught_up: float = field(
        default=10.0,
        metadata={
            "help": "Seconds a follower may go without reaching the leader's position before it leaves the in-sync set."
        },
    )
    allow_lagging_leader: bool = field(
        default=True,
        metadata={"help": "Never let a broker outside the in-sync set lead, even when no member is alive."},
    )
    insync_check_ms: int = field(
        default=200,
        metadata={
            "help": "How often the leader re-checks the in-sync set and a pending admin elect.",
            "min": 1,
        },
    )
    secret_file: str = field(
        default="",
        metadata={
            "help": "File holding the cluster secret; required when the cluster's digest is hmac-sha256.",
            "path": "file",
        },
    )
    keys_file: str = keys_file_field()
    key_file: str = key_file_field("broker")
    autorecovery: bool = field(
        default=True,
        metadata={
            "help": "In an hmac-sha256 cluster, do not run AutoRecovery in this broker. Bookies hold no secret "
            "to verify the copies they would re-replicate, so there the brokers run it."
        },
    )
    lost_bookie_grace_s: float = field(
        default=60.0,
        metadata={
            "help": "With AutoRecovery (hmac-sha256 clusters): seconds a bookie may stay unregistered before "
            "its closed ledgers are marked under-replicated.",
            "min": 1,
        },
    )
    rereplication_max_bytes_per_s: int = field(
        default=20 * 1024 * 1024,
        metadata={
            "help": "With AutoRecovery (hmac-sha256 clusters): throttle of re-replication copies in bytes per "
            "second (0: unlimited).",
            "default_text": "20 MiB",
            "min": 0,
        },
    )
    # The cluster-wide options (the `config` node): None takes the cluster's; a value that
    # differs from the cluster's stops the broker at start, naming the difference.
    write_quorum: int | None = cluster_option_field("write_quorum")
    ack_quorum: int | None = cluster_option_field("ack_quorum")
    ensemble_size: int | None = cluster_option_field("ensemble_size")
    digest: str | None = cluster_option_field("digest")
    max_payload_bytes: int | None = cluster_option_field("max_payload_bytes")
    init_if_missing: bool = init_if_missing_field()
    wait_for: int = field(
        default=0,
        metadata={
            "help": "Stand for election (so serve clients) only once this many brokers are live, this one "
            "included; 0 or 1: at once. Once seen, the condition holds for the rest of the process.",
            "min": 0,
        },
    )
    max_frame_bytes: int = field(
        default=8 * 1024 * 1024,
        metadata={"help": "Largest request frame accepted.", "default_text": "8 MiB", "min": 1},
    )
    max_batch_events: int = field(
        default=2000,
        metadata={
            "help": "Most events in one ledger entry; also the most requests read per loop turn.",
            "min": 1,
        },
    )
    max_inflight_entries: int = field(
        default=8,
        metadata={
            "help": "Ledger entries the leader keeps in flight at once when its batches are full (a batch "
            "that is not full waits for the entry in flight: group commit).",
            "min": 1,
        },
    )
    tick_ms: int = field(default=50, metadata={"help": "Longest wait of one request-loop turn.", "min": 1})
    lease_check_ms: int = field(
        default=200, metadata={"help": "How often the leader looks for expired leases.", "min": 1}
    )
    digest_every_entries: int = field(
        default=200, metadata={"help": "The leader writes a state digest after this many entries.", "min": 1}
    )
    default_lease_ms: int = field(
        default=30_000, metadata={"help": "Lease length for a lease or heartbeat that names none.", "min": 1}
    )
    retry_backoff_ms: int = field(
        default=1000,
        metadata={
            "help": "Retry backoff of a failed task whose submit and queue set none: its first retry waits this "
            "long, each later one twice as long as the one before (0: retry at once).",
            "min": 0,
        },
    )
    retry_backoff_max_ms: int = field(
        default=300_000,
        metadata={"help": "Cap of the default retry backoff: no retry waits longer.", "min": 0},
    )
    worker_seen_s: float = field(
        default=0.0,
        metadata={
            "help": "While leading: also record a worker whose requests write nothing (an idle worker's long polls) "
            "as seen (WorkerSeen) about this often. 0: only when this leader first hears from it or its "
            "queues change, so an idle fleet writes nothing; `worker list` shows the leader's own last-seen "
            "time either way.",
            "min": 0,
        },
    )
    worker_lost_s: float = field(
        default=60.0,
        metadata={
            "help": "While leading: a worker not heard of for this long, and holding no lease that still runs, is "
            "lost (WorkerLost): it leaves `worker list` and the leases it still held end. Keep it above the "
            "workers' heartbeat interval (a third of their lease) and long-poll wait.",
            "min": 0.5,
        },
    )
    result_ttl_s: float = field(
        default=0.0,
        metadata={
            "help": "While leading: purge done, failed, dead and cancelled tasks this long after they finished, in "
            "queues that set no result_ttl of their own (declare_queue); 0 keeps them.",
            "min": 0,
        },
    )
    tail_pause_ms: int = field(
        default=10,
        metadata={
            "help": "A follower whose read brought less than a full batch waits this long before the next, "
            "so that one read brings several entries: less work for it and its bookie under load, at "
            "most this much more lag. 0: read again at once.",
            "min": 0,
        },
    )
    live_update_ms: int = field(
        default=500, metadata={"help": "How often this broker's live node is refreshed.", "min": 1}
    )
    map_size: int = field(
        default=16 * 1024**3,
        metadata={
            "help": "LMDB map size of the state store in bytes (sparse).",
            "default_text": "16 GiB",
            "min": 1 << 20,
        },
    )
    fsync: bool = field(
        default=True, metadata={"help": "Do not fsync the state store even at an orderly close (tests only)."}
    )
    fsync_each_apply: bool = field(
        default=False,
        metadata={
            "help": "fsync the state store on every applied entry. Not needed for safety: the ledgers hold "
            "every committed entry, and a store not closed in order is verified in full at start "
            "and rebuilt if a machine crash tore it."
        },
    )
    checkpoint_entries: int = field(
        default=50_000, metadata={"help": "Snapshot after this many applied entries.", "min": 1}
    )
    checkpoint_seconds: float = field(default=600.0, metadata={"help": "Snapshot at least this often."})
    snapshots_kept: int = field(default=3, metadata={"help": "Snapshots kept on disk.", "min": 1})
    retention_seconds: float = field(
        default=3600.0, metadata={"help": "Minimum age before a ledger covered by a snapshot may be deleted."}
    )
    ledger_max_entries: int = field(
        default=100_000,
        metadata={"help": "The leader rolls to a new ledger past this many entries.", "min": 1},
    )
    ledger_max_bytes: int = field(
        default=256 * 1024 * 1024,
        metadata={
            "help": "The leader rolls to a new ledger past this many bytes.",
            "default_text": "256 MiB",
            "min": 1,
        },
    )
    shutdown_timeout: float = field(
        default=10.0,
        metadata={"help": "SIGTERM stops the broker within this many seconds, whatever ZooKeeper's state."},
    )

    def validate(self) -> "BrokerConfig":
        if not 1 <= self.lost_bookie_grace_s <= 30 * 86400 or self.rereplication_max_bytes_per_s < 0:
            raise BrokerConfigError(
                "lost_bookie_grace_s must be 1-2592000 seconds and rereplication_max_bytes_per_s >= 0"
            )
        if not _TCP.match(self.listen):
            raise BrokerConfigError(f"listen must look like tcp://HOST:PORT, got {self.listen!r}")
        if self.listen.removeprefix("tcp://").rsplit(":", 1)[0] in WILDCARD_HOSTS:
            raise BrokerConfigError(
                f"listen {self.listen!r} is also the address clients connect to: "
                "give a reachable host or IP, not a wildcard"
            )
        if self.metrics_listen:
            try:
                parse_metrics_listen(self.metrics_listen)
            except ElectionError as exc:
                raise BrokerConfigError(str(exc)) from None
        if not 0.4 <= self.zk_session_timeout <= 120:
            raise BrokerConfigError("zk_session_timeout must be between 0.4 and 120 seconds")
        for name in (
            "max_batch_events",
            "max_inflight_entries",
            "tick_ms",
            "lease_check_ms",
            "digest_every_entries",
            "default_lease_ms",
            "live_update_ms",
        ):
            if getattr(self, name) < 1:
                raise BrokerConfigError(f"{name} must be at least 1")
        if not (self.worker_seen_s == 0 or 0.1 <= self.worker_seen_s) or not (
            self.worker_seen_s < self.worker_lost_s <= 30 * 86400
        ):
            raise BrokerConfigError(
                "worker_seen_s must be 0 or at least 0.1, and below worker_lost_s, "
                "which must be at most 2592000 seconds"
            )
        if not 0 <= self.result_ttl_s * 1000 <= MAX_SPAN_MS:
            raise BrokerConfigError(f"result_ttl_s must be 0-{MAX_SPAN_MS // 1000} seconds")
        if self.tail_pause_ms < 0:
            raise BrokerConfigError("tail_pause_ms must be at least 0")
        if not 0 <= self.retry_backoff_ms <= MAX_SPAN_MS or not 0 <= self.retry_backoff_max_ms <= MAX_SPAN_MS:
            raise BrokerConfigError(f"retry_backoff_ms and retry_backoff_max_ms must be 0-{MAX_SPAN_MS}")
        for name in ("checkpoint_entries", "snapshots_kept", "ledger_max_entries", "ledger_max_bytes"):
            if getattr(self, name) < 1:
                raise BrokerConfigError(f"{name} must be at least 1")
        if self.checkpoint_seconds <= 0 or self.retention_seconds < 0:
            raise BrokerConfigError("checkpoint_seconds must be > 0 and retention_seconds >= 0")
        if not 1 <= self.shutdown_timeout <= 600:
            raise BrokerConfigError("shutdown_timeout must be between 1 and 600 seconds")
        if self.max_lag_entries < 0 or self.max_time_not_caught_up <= 0 or self.insync_check_ms < 1:
            raise BrokerConfigError(
                "max_lag_entries must be >= 0, max_time_not_caught_up > 0, insync_check_ms >= 1"
            )
        if self.wait_for < 0:
            raise BrokerConfigError("wait_for must be >= 0")
        if self.map_size < 1 << 20:
            raise BrokerConfigError("map_size must be at least 1 MiB")
        validate_member_options(self, BrokerConfigError)
        if self.digest == "hmac-sha256" and not self.secret_file:
            raise BrokerConfigError("digest hmac-sha256 needs --secret-file with the cluster secret")
        check_secure_settings(self, BrokerConfigError)
        return self
