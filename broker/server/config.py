"""Configuration of one broker process (`fencepost broker start`).

Example::

    config = load_settings(BrokerConfig, "broker", flags={"data": "b1", "listen": "tcp://127.0.0.1:5601"})
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from broker import BrokerError
from broker.state.events import MAX_SPAN_MS
from election.local.member_config import THIRTY_DAYS_S, MemberConfig, member_field, setting
from election.shards import MAX_SHARDS
from election.task_settings import SETTINGS as TASK_SETTINGS

_CLUSTER_WIDE = (
    " A cluster-wide task setting: this option counts only while the cluster's config holds none "
    "(a cluster initialised before version 0.3.0) and is what a config this broker creates takes; "
    "see `fencepost cluster config`."
)


def task_setting(name: str, help: str, **metadata: Any) -> Any:
    """The field of a cluster-wide task setting (election/task_settings.py): its default is the cluster's."""
    return setting(TASK_SETTINGS[name].default, help + _CLUSTER_WIDE, **metadata)


class BrokerConfigError(BrokerError):
    """A broker setting is missing or out of range."""


@dataclass
class BrokerConfig(MemberConfig):
    """Every setting of a broker: the shared ones of :class:`MemberConfig`, and its own.

    See docs/configuration.md for each one's meaning. The ``metadata`` of each field is its
    command-line option's help and range (``broker start``'s options are generated from
    these fields).
    """

    config_error: ClassVar[type[Exception]] = BrokerConfigError
    former_names: ClassVar[Mapping[str, str]] = {
        **MemberConfig.former_names,
        "zk_session_timeout": "zk_session_timeout_s",
        "max_time_not_caught_up": "max_time_not_caught_up_s",
        "checkpoint_seconds": "checkpoint_s",
        "retention_seconds": "retention_s",
        "shutdown_timeout": "shutdown_timeout_s",
    }

    data: str = member_field("data", "./broker-data")
    listen: str = member_field("listen", "tcp://127.0.0.1:5601")
    map_size_bytes: int = member_field("map_size_bytes", 16 * 1024**3, default_text="16 GiB")
    name: str = setting("", "Broker name.", default_text="the data dir's name")
    learner: bool = setting(False, "Replicate only: never join the in-sync set nor lead.")
    max_lag_entries: int = task_setting(
        "max_lag_entries",
        "A follower within this many entries of the leader may be in the in-sync set.",
        min=0,
    )
    max_time_not_caught_up_s: float = task_setting(
        "max_time_not_caught_up_s",
        "Seconds a follower may go without reaching the leader's position before it leaves the in-sync set.",
        unit="s",
        min=0,
        min_open=True,
    )
    allow_lagging_leader: bool = task_setting(
        "allow_lagging_leader",
        "Never let a broker outside the in-sync set lead, even when no member is alive.",
    )
    insync_check_ms: int = setting(
        200, "How often the leader re-checks the in-sync set and a pending admin elect.", unit="ms", min=1
    )
    leader_timeout_s: float = setting(
        0.8,
        "A follower that may stand takes the leader's place in the election once the leader answered none "
        "of its heartbeats (one every 100 ms) for this long, or at once when its connection is refused or "
        "reset, without waiting for the leader's ZooKeeper session to expire. Lower: faster failover of a "
        "silent leader; too low for the machine: a busy leader is replaced (a failover, never a lost write).",
        unit="s",
        min=0.2,
        max=60,
    )
    leader_balance_s: float = setting(
        30.0,
        "In a cluster of several shards: a broker that has led a shard this long hands it to the shard's "
        "preferred leader when that broker is live, in sync and no learner, looking at most once per this "
        "many seconds. 0: never.",
        unit="s",
        min=0,
        max=86400,
    )
    secret_file: str = setting(
        "",
        "File holding the cluster secret; required when the cluster's digest is hmac-sha256.",
        path="file",
    )
    wait_for: int = setting(
        0,
        "Stand for election (so serve clients) only once this many brokers are live, this one "
        "included; 0 or 1: at once. Once seen, the condition holds for the rest of the process.",
        min=0,
    )
    max_batch_events: int = setting(
        2000, "Most events in one ledger entry; also the most requests read per loop turn.", min=1
    )
    max_inflight_entries: int = setting(
        8,
        "Ledger entries the leader keeps in flight at once when its batches are full (a batch "
        "that is not full waits for the entry in flight: group commit).",
        min=1,
    )
    tick_ms: int = setting(50, "Longest wait of one request-loop turn.", unit="ms", min=1)
    lease_check_ms: int = setting(200, "How often the leader looks for expired leases.", unit="ms", min=1)
    digest_every_entries: int = setting(
        200, "The leader writes a state digest after this many entries.", min=1
    )
    default_lease_ms: int = task_setting(
        "default_lease_ms", "Lease length for a lease or heartbeat that names none.", unit="ms", min=1
    )
    retry_backoff_ms: int = task_setting(
        "retry_backoff_ms",
        "Retry backoff of a failed task whose submit and queue set none: its first retry waits this "
        "long, each later one twice as long as the one before (0: retry at once).",
        unit="ms",
        min=0,
        max=MAX_SPAN_MS,
    )
    retry_backoff_max_ms: int = task_setting(
        "retry_backoff_max_ms",
        "Cap of the default retry backoff: no retry waits longer.",
        unit="ms",
        min=0,
        max=MAX_SPAN_MS,
    )
    worker_seen_s: float = setting(
        0.0,
        "While leading: also record a worker whose requests write nothing (an idle worker's long polls) "
        "as seen (WorkerSeen) about this often. 0: only when this leader first hears from it or its "
        "queues change, so an idle fleet writes nothing; `worker list` shows the leader's own last-seen "
        "time either way.",
        unit="s",
        min=0,
    )
    worker_lost_s: float = task_setting(
        "worker_lost_s",
        "While leading: a worker not heard of for this long, and holding no lease that still runs, is "
        "lost (WorkerLost): it leaves `worker list` and the leases it still held end. Keep it above the "
        "workers' heartbeat interval (a third of their lease) and long-poll wait.",
        unit="s",
        min=0.5,
        max=THIRTY_DAYS_S,
    )
    result_ttl_s: float = task_setting(
        "result_ttl_s",
        "While leading: purge done, failed, dead and cancelled tasks this long after they finished, in "
        "queues that set no result_ttl of their own (declare_queue); 0 keeps them.",
        unit="s",
        min=0,
        max=MAX_SPAN_MS / 1000,
    )
    tail_pause_ms: int = setting(
        10,
        "A follower whose read brought less than a full batch waits this long before the next, "
        "so that one read brings several entries: less work for it and its bookie under load, at "
        "most this much more lag. 0: read again at once.",
        unit="ms",
        min=0,
    )
    live_update_ms: int = setting(500, "How often this broker's live node is refreshed.", unit="ms", min=1)
    fsync_each_apply: bool = setting(
        False,
        "fsync the state store on every applied entry. Not needed for safety: the ledgers hold "
        "every committed entry, and a store not closed in order is verified in full at start "
        "and rebuilt if a machine crash tore it.",
    )
    checkpoint_entries: int = setting(50_000, "Snapshot after this many applied entries.", min=1)
    checkpoint_s: float = setting(
        600.0, "Snapshot at least this often, in seconds.", unit="s", min=0, min_open=True
    )
    snapshots_kept: int = setting(3, "Snapshots kept on disk.", min=1)
    retention_s: float = setting(
        3600.0,
        "Minimum age in seconds before a ledger covered by a snapshot may be deleted.",
        unit="s",
        min=0,
    )
    ledger_max_entries: int = setting(
        100_000, "The leader rolls to a new ledger past this many entries.", min=1
    )
    ledger_max_bytes: int = setting(
        256 * 1024 * 1024,
        "The leader rolls to a new ledger past this many bytes.",
        unit="bytes",
        default_text="256 MiB",
        min=1,
    )
    max_roll_postpone_s: float = setting(
        600.0,
        "While ZooKeeper is unreachable the leader goes on committing in its ledger and postpones a roll "
        "that is due; once one has waited this long it refuses writes (unavailable, reason roll_postponed) "
        "until ZooKeeper is back and the roll is done. 0: never refuse.",
        unit="s",
        min=0,
    )
    shard: int = setting(
        0,
        "The shard this process serves. Not for operators: the broker they start serves shard 0 and, in a "
        "cluster of several shards, starts one process per other shard with this set (`broker start "
        "--shard N`, a hidden option).",
        min=0,
        max=MAX_SHARDS - 1,
        hidden=True,
    )
    shutdown_timeout_s: float = setting(
        10.0,
        "SIGTERM stops the broker within this many seconds, whatever ZooKeeper's state.",
        unit="s",
        min=1,
        max=600,
    )

    def validate(self) -> "BrokerConfig":
        """Check every setting; raise BrokerConfigError naming the first bad one."""
        super().validate()
        if (
            not (self.worker_seen_s == 0 or 0.1 <= self.worker_seen_s)
            or self.worker_seen_s >= self.worker_lost_s
        ):
            raise BrokerConfigError("worker_seen_s must be 0 or at least 0.1, and below worker_lost_s")
        if self.digest == "hmac-sha256" and not self.secret_file:
            raise BrokerConfigError("digest hmac-sha256 needs --secret-file with the cluster secret")
        return self
