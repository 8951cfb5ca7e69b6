"""The settings every cluster member has: the config fields bookies and brokers share, declared once.

:class:`MemberConfig` is the base of ``BookieConfig`` (``ledger/bookie/config.py``) and
``BrokerConfig`` (``broker/server/config.py``): each shared setting has one help text, one unit
and one range, and :meth:`MemberConfig.validate` checks them alike in both processes. A kind
that needs its own default for a shared field (``data``, ``listen``, ``map_size_bytes``)
redeclares it with :func:`member_field`, which keeps everything else of the base's field.

A field's metadata says what its command-line option, the settings loader and
:func:`check_fields` need beyond its name, type and default:

- ``help``, ``default_text``, ``path`` and ``choices``: the generated option's (see the
  command options module);
- ``unit``: ``"s"``, ``"ms"``, ``"bytes"`` or ``"bytes/s"``. The naming rule: a field with a unit
  ends in ``_s``, ``_ms``, ``_bytes`` or ``_bytes_per_s`` (:data:`UNIT_SUFFIXES`), and a field
  whose name ends so has that unit;
- ``min`` and ``max``: the field's one range, both ends included, unless ``min_open`` (then the
  value must be above ``min``).

A field renamed to follow the rule keeps its old spelling as a flag, ``FENCEPOST_<OLD>``
variable and TOML key: the class's ``former_names`` (old -> new) is read by
:func:`election.local.settings.load_settings`, which takes the value and logs a deprecation
warning naming the new spelling.

Example::

    @dataclass
    class BookieConfig(MemberConfig):
        config_error: ClassVar[type[Exception]] = LedgerError
        data: str = member_field("data", "./bookie-data")
        max_batch: int = setting(1000, "Frames drained per poll turn.", min=1, max=1_000_000)
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from election import ElectionError
from election.cluster_config import cluster_option_field, init_if_missing_field, validate_member_options
from election.local.metrics_endpoint import parse_metrics_listen
from election.paths import check_cluster_name
from election.secure.keyring import check_secure_settings, key_file_field, keys_file_field

# The unit of a field -> how its name ends.
UNIT_SUFFIXES = {"bytes/s": "_bytes_per_s", "s": "_s", "ms": "_ms", "bytes": "_bytes"}
_UNIT_WORDS = {"s": " seconds", "ms": " ms", "bytes": " bytes", "bytes/s": " bytes per second"}
# Addresses a server can bind but nobody can connect to; `listen` is advertised as is.
WILDCARD_HOSTS = frozenset({"*", "0.0.0.0", "[::]", "::"})
_LISTEN = re.compile(r"^tcp://(?P<host>\*|\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$")
THIRTY_DAYS_S = 30 * 86400


def setting(default: Any, help: str, *, unit: str | None = None, **metadata: Any) -> Any:
    """A config field: its default, help text, unit and the rest of its metadata (``min``, ``max``...)."""
    if unit is not None:
        if unit not in UNIT_SUFFIXES:
            raise TypeError(f"unknown unit {unit!r}")
        metadata["unit"] = unit
    return field(default=default, metadata={"help": help, **metadata})


def unit_of_name(name: str) -> str | None:
    """The unit a field's name says it has (``zk_session_timeout_s`` -> ``"s"``), or None."""
    return next((unit for unit, suffix in UNIT_SUFFIXES.items() if name.endswith(suffix)), None)


def parse_listen(listen: str, error: type[Exception] = ElectionError) -> tuple[str, int]:
    """Split a member's ``tcp://host:port`` into ``(host, port)``; raise ``error`` if malformed.

    The address is also the one others connect to, so a wildcard host is refused.
    """
    match = _LISTEN.match(listen) if isinstance(listen, str) else None
    if not match or not 1 <= int(match.group("port")) <= 65535:
        raise error(f"listen must look like tcp://HOST:PORT with a port in 1-65535, got {listen!r}")
    if match.group("host") in WILDCARD_HOSTS:
        raise error(
            f"listen {listen!r} is also the address other processes connect to: "
            "give a reachable host or IP, not a wildcard"
        )
    return match.group("host"), int(match.group("port"))


def _base_type(hint: Any) -> Any:
    """``int | None`` -> ``int``; other hints unchanged."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def range_text(metadata: Mapping[str, Any]) -> str:
    """``between 1 and 600 seconds``, ``at least 0``, ``more than 0``: a field's range, as read."""
    low, high, unit = metadata.get("min"), metadata.get("max"), _UNIT_WORDS.get(metadata.get("unit"), "")
    if low is not None and high is not None:
        text = (
            f"more than {low} and at most {high}" if metadata.get("min_open") else f"between {low} and {high}"
        )
    elif low is not None:
        text = f"more than {low}" if metadata.get("min_open") else f"at least {low}"
    else:
        text = f"at most {high}"
    return text + unit


def _in_range(value: float, metadata: Mapping[str, Any]) -> bool:
    low, high = metadata.get("min"), metadata.get("max")
    if low is not None and (value <= low if metadata.get("min_open") else value < low):
        return False
    return high is None or value <= high


def check_fields(config: object, error: type[Exception]) -> None:
    """Each field of ``config`` has its type and lies in its range; raise ``error`` naming the first that does not."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value, kind = getattr(config, f.name), _base_type(hints[f.name])
        if value is None and kind is not hints[f.name]:
            continue  # an optional setting left unset
        if kind is bool and not isinstance(value, bool):
            raise error(f"{f.name} must be true or false, got {value!r}")
        if kind in (int, float):
            allowed = int if kind is int else (int, float)
            if not isinstance(value, allowed) or isinstance(value, bool):
                what = "an integer" if kind is int else "a number"
                raise error(f"{f.name} must be {what}, got {value!r}")
            if not _in_range(value, f.metadata):
                raise error(f"{f.name} must be {range_text(f.metadata)}, got {value!r}")
        if kind is str and not isinstance(value, str):
            raise error(f"{f.name} must be a string, got {value!r}")


@dataclass
class MemberConfig:
    """The settings of a cluster member, bookie or broker; docs/configuration.md describes each.

    A subclass sets ``config_error`` (the error its ``validate`` raises) and may add to
    ``former_names`` the old spellings of its own renamed fields.
    """

    config_error: ClassVar[type[Exception]] = ElectionError
    former_names: ClassVar[Mapping[str, str]] = {"map_size": "map_size_bytes"}

    # Each kind gives these three its own default (member_field).
    data: str = setting(dataclasses.MISSING, "Data directory.", path="dir")
    listen: str = setting(
        dataclasses.MISSING,
        "Address to serve on, tcp://HOST:PORT; also the address the others connect to (no wildcard).",
    )
    map_size_bytes: int = setting(
        dataclasses.MISSING,
        "LMDB map size in bytes, the most the store can hold (sparse: it costs address space, not disk).",
        unit="bytes",
        min=1 << 20,
        max=1 << 46,
    )
    metrics_listen: str = setting(
        "",
        "Serve Prometheus metrics on http://HOST:PORT/metrics (docs/operations.md lists them); "
        "empty: off. Bind a loopback or private address: the endpoint has no authentication.",
    )
    zk: str = setting("127.0.0.1:2181", "ZooKeeper hosts host:port,...")
    cluster: str = setting("dev", "Cluster name.")
    keys_file: str = keys_file_field()
    key_file: str = key_file_field()
    max_frame_bytes: int = setting(
        8 * 1024 * 1024,
        "Largest request frame accepted.",
        unit="bytes",
        default_text="8 MiB",
        min=1024,
        max=256 * 1024 * 1024,
    )
    fsync: bool = setting(
        True,
        "Do not fsync (tests only: a bookie may lose acknowledged entries in a machine crash, a broker "
        "does not flush its state store even at an orderly close).",
    )
    zk_session_timeout_s: float = setting(
        10.0,
        "ZooKeeper session timeout in seconds: how long a dead member stays registered, so it bounds "
        "a dead leader's failover time.",
        unit="s",
        min=0.4,
        max=600,
    )
    autorecovery: bool = setting(
        True,
        "Do not run AutoRecovery here (the elected auditor that marks closed ledgers of lost bookies "
        "under-replicated, and the worker that re-replicates them). Bookies run it in a crc32c cluster, "
        "brokers in an hmac-sha256 one: bookies hold no secret to verify the copies they would make.",
    )
    lost_bookie_grace_s: float = setting(
        60.0,
        "Seconds a bookie may stay unregistered before the auditor marks its closed ledgers "
        "under-replicated and re-replication replaces it.",
        unit="s",
        min=1,
        max=THIRTY_DAYS_S,
    )
    rereplication_max_bytes_per_s: int = setting(
        20 * 1024 * 1024,
        "Throttle of re-replication copies in bytes per second (0: unlimited), so that it does not take the leader's write "
        "bandwidth.",
        unit="bytes/s",
        default_text="20 MiB",
        min=0,
        max=1 << 40,
    )
    # The cluster-wide options (the `config` node): None takes the cluster's; a value that
    # differs from the cluster's stops the member at start, naming the difference.
    write_quorum: int | None = cluster_option_field("write_quorum")
    ack_quorum: int | None = cluster_option_field("ack_quorum")
    ensemble_size: int | None = cluster_option_field("ensemble_size")
    digest: str | None = cluster_option_field("digest")
    max_payload_bytes: int | None = cluster_option_field("max_payload_bytes")
    init_if_missing: bool = init_if_missing_field()

    def validate(self) -> "MemberConfig":
        """Check the shared settings and every field's type and range; raise ``config_error`` naming the first bad one."""
        error = self.config_error
        check_fields(self, error)
        if not self.data:
            raise error("data must be a directory path")
        parse_listen(self.listen, error)
        if self.metrics_listen:
            try:
                parse_metrics_listen(self.metrics_listen)
            except ElectionError as exc:
                raise error(str(exc)) from None
        if not self.zk.strip():
            raise error("zk must list ZooKeeper servers as host:port[,host:port...]")
        try:
            check_cluster_name(self.cluster)
        except ElectionError as exc:
            raise error(f"cluster: {exc}") from None
        validate_member_options(self, error)
        check_secure_settings(self, error)
        return self


def member_field(name: str, default: Any, **metadata: Any) -> Any:
    """:class:`MemberConfig`'s field ``name`` with a kind's own default (and ``default_text``)."""
    base = MemberConfig.__dataclass_fields__[name]
    return field(default=default, metadata={**base.metadata, **metadata})
