"""Configuration of one bookie process (``fencepost bookie start``).

Values come from flags, ``FENCEPOST_<FIELD>`` environment variables and the
``[bookie]`` table of ``fencepost.toml`` through
:func:`election.local.settings.load_settings`; :meth:`BookieConfig.validate` runs last
so that a bad value stops the process with a message naming the option, before
it touches ZooKeeper or the data directory.

Example::

    config = load_settings(BookieConfig, "bookie", flags={"listen": "tcp://127.0.0.1:3181"})
    run_bookie(config)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from election import ElectionError
from election.cluster_config import cluster_option_field, init_if_missing_field, validate_member_options
from election.local.metrics_endpoint import parse_metrics_listen
from election.secure.keyring import check_secure_settings, key_file_field, keys_file_field
from ledger import LedgerError
from ledger.bookie.store import DEFAULT_MAP_SIZE

_LISTEN = re.compile(r"^tcp://(?P<host>\*|\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$")
_BOOKIE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def parse_listen(listen: str) -> tuple[str, int]:
    """Split ``tcp://host:port`` into ``(host, port)``; raise LedgerError if malformed."""
    match = _LISTEN.match(listen) if isinstance(listen, str) else None
    if not match or not 1 <= int(match.group("port")) <= 65535:
        raise LedgerError(f"listen must look like tcp://HOST:PORT with a port in 1-65535, got {listen!r}")
    if match.group("host") in WILDCARD_HOSTS:
        raise LedgerError(
            f"listen {listen!r} is also the address other processes connect to: "
            "give a reachable host or IP, not a wildcard"
        )
    return match.group("host"), int(match.group("port"))


# Addresses a server can bind but nobody can connect to; `listen` is advertised as is.
WILDCARD_HOSTS = frozenset({"*", "0.0.0.0", "[::]", "::"})


@dataclass
class BookieConfig:
    """Every option of a bookie; see docs/configuration for the reference.

    The ``metadata`` of each field is its command-line option's help (``cli_options.py``
    generates ``bookie start``'s options from these fields).

    A bookie has no ``secret_file``: it never verifies an ``hmac-sha256`` digest (it
    checks an entry's framing, and a CRC32C digest after a crash, and stores the bytes;
    the readers verify), so it needs no cluster secret. It still compares the shared
    options it is given (``digest`` included) with the cluster's.
    """

    data: str = field(default="./bookie-data", metadata={"help": "Data directory.", "path": "dir"})
    listen: str = field(
        default="tcp://127.0.0.1:3181", metadata={"help": "Address to serve on, tcp://HOST:PORT."}
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
    keys_file: str = keys_file_field()
    key_file: str = key_file_field("bookie")
    bookie_id: str | None = field(
        default=None, metadata={"help": "Stable bookie id.", "default_text": "kept in the data dir's cookie"}
    )
    max_frame_bytes: int = field(
        default=8 * 1024 * 1024,
        metadata={"help": "Largest request frame accepted.", "default_text": "8 MiB", "min": 1024},
    )
    max_batch: int = field(
        default=1000,
        metadata={"help": "Frames drained per poll turn: the most adds in one group commit.", "min": 1},
    )
    long_poll_max_ms: int = field(default=30000, metadata={"help": "Cap on a wait_lac long poll.", "min": 0})
    fsync: bool = field(
        default=True, metadata={"help": "Do not fsync (tests only: loses acked data on a crash)."}
    )
    map_size: int = field(
        default=DEFAULT_MAP_SIZE,
        metadata={
            "help": "LMDB map size in bytes, the most the store can hold (sparse).",
            "default_text": f"{DEFAULT_MAP_SIZE >> 30} GiB",
            "min": 1 << 20,
        },
    )
    zk_session_timeout_s: float = field(
        default=10.0,
        metadata={"help": "ZooKeeper session timeout in seconds: how long a dead bookie stays registered."},
    )
    autorecovery: bool = field(
        default=True,
        metadata={
            "help": "Do not run AutoRecovery in this bookie (the elected auditor that marks closed ledgers of lost "
            "bookies under-replicated, and the worker that re-replicates them)."
        },
    )
    lost_bookie_grace_s: float = field(
        default=60.0,
        metadata={
            "help": "Seconds a bookie may stay unregistered before the auditor marks its closed ledgers "
            "under-replicated and re-replication replaces it.",
            "min": 1,
        },
    )
    rereplication_max_bytes_per_s: int = field(
        default=20 * 1024 * 1024,
        metadata={
            "help": "Throttle of re-replication copies in bytes per second (0: unlimited), so that it does not "
            "take the leader's write bandwidth.",
            "default_text": "20 MiB",
            "min": 0,
        },
    )
    gc_interval_s: float = field(
        default=60.0,
        metadata={
            "help": "Seconds between garbage-collection passes, which delete the local copies of ledgers whose "
            "metadata no longer names this bookie (one pass also runs at start, before serving)."
        },
    )
    # The cluster-wide options (the `config` node): None takes the cluster's; a value that
    # differs from the cluster's stops the bookie at start, naming the difference.
    write_quorum: int | None = cluster_option_field("write_quorum")
    ack_quorum: int | None = cluster_option_field("ack_quorum")
    ensemble_size: int | None = cluster_option_field("ensemble_size")
    digest: str | None = cluster_option_field("digest")
    max_payload_bytes: int | None = cluster_option_field("max_payload_bytes")
    init_if_missing: bool = init_if_missing_field()

    def validate(self) -> "BookieConfig":
        """Check every option; raise LedgerError naming the first bad one."""
        if not isinstance(self.data, str) or not self.data:
            raise LedgerError("data must be a directory path")
        parse_listen(self.listen)
        if self.metrics_listen:
            try:
                parse_metrics_listen(self.metrics_listen)
            except ElectionError as exc:
                raise LedgerError(str(exc)) from None
        if not isinstance(self.zk, str) or not self.zk.strip():
            raise LedgerError("zk must list ZooKeeper servers as host:port[,host:port...]")
        if not isinstance(self.cluster, str) or not re.match(
            r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", self.cluster
        ):
            raise LedgerError(f"cluster must be 1-64 letters, digits, '.', '_' or '-', got {self.cluster!r}")
        if self.bookie_id is not None and (
            not isinstance(self.bookie_id, str) or not _BOOKIE_ID.match(self.bookie_id)
        ):
            raise LedgerError(
                f"bookie_id must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit, got {self.bookie_id!r}"
            )
        for name, low, high in (
            ("max_frame_bytes", 1024, 256 * 1024 * 1024),
            ("max_batch", 1, 1_000_000),
            ("long_poll_max_ms", 0, 3_600_000),
            ("map_size", 1024 * 1024, 1 << 46),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise LedgerError(f"{name} must be an integer between {low} and {high}, got {value!r}")
        if not isinstance(self.fsync, bool):
            raise LedgerError(f"fsync must be true or false, got {self.fsync!r}")
        if (
            not isinstance(self.zk_session_timeout_s, (int, float))
            or not 1 <= self.zk_session_timeout_s <= 600
        ):
            raise LedgerError(
                f"zk_session_timeout_s must be between 1 and 600 seconds, got {self.zk_session_timeout_s!r}"
            )
        if not isinstance(self.autorecovery, bool):
            raise LedgerError(f"autorecovery must be true or false, got {self.autorecovery!r}")
        if (
            not isinstance(self.lost_bookie_grace_s, (int, float))
            or isinstance(self.lost_bookie_grace_s, bool)
            or not 1 <= self.lost_bookie_grace_s <= 30 * 86400
        ):
            raise LedgerError(
                f"lost_bookie_grace_s must be between 1 and 2592000 seconds, got {self.lost_bookie_grace_s!r}"
            )
        rate = self.rereplication_max_bytes_per_s
        if not isinstance(rate, int) or isinstance(rate, bool) or not 0 <= rate <= 1 << 40:
            raise LedgerError(
                f"rereplication_max_bytes_per_s must be an integer between 0 and {1 << 40}, got {rate!r}"
            )
        if (
            not isinstance(self.gc_interval_s, (int, float))
            or isinstance(self.gc_interval_s, bool)
            or not 0 < self.gc_interval_s <= 30 * 86400
        ):
            raise LedgerError(
                f"gc_interval_s must be more than 0 and at most 2592000 seconds, got {self.gc_interval_s!r}"
            )
        validate_member_options(self, LedgerError)
        if not isinstance(self.init_if_missing, bool):
            raise LedgerError(f"init_if_missing must be true or false, got {self.init_if_missing!r}")
        check_secure_settings(self, LedgerError)
        return self

    def default_bookie_id(self) -> str:
        """``bookie-<host>-<port>`` from ``listen``: the id used when none is configured.

        It only names a fresh data directory: the id is then kept in the cookie,
        so moving the bookie to another port does not change its identity.
        """
        host, port = parse_listen(self.listen)
        host = host.strip("[]")
        return "bookie-" + "".join(c if c.isalnum() or c in "-." else "_" for c in host) + f"-{port}"
