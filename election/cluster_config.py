"""The cluster's `config` node: its id and the options every member must share.

`fencepost cluster init` creates the node once (:func:`init_cluster`): a uuid4
`cluster_id`, which is every store's initial signature, `created_at`, and the
options of :class:`ClusterOptions`. A second init is refused
(:class:`ClusterAlreadyInitialized`). Every broker and bookie then joins with
:func:`join_cluster`: it reads the node, compares the options it was given
(only those it was given: an option left unset means "take the cluster's") and
aborts with :class:`ConfigMismatch` naming each difference. A member started
before `init` waits for the node, unless it was told to create it with its own
(or the default) options (``init_if_missing``, for `dev up` and tests; that is
:func:`ensure_cluster_config`).

``shards`` (``cluster init --shards S``, fixed for the cluster's life) is written only when
S > 1: a config without it is a cluster of one shard, as every cluster made before shards
(:func:`cluster_shards` reads it; election/shards.py).

The cluster secret (the key of the ``hmac-sha256`` digest) is never written
anywhere: members read it from their ``--secret-file`` (:func:`read_secret`).
The node only holds ``secret_check``, an HMAC of the cluster id keyed by the
secret, so that a member with the wrong secret is refused at start instead of
finding every entry "corrupt" (a reader treats such copies as missing).

Example::

    config = init_cluster(zk, ClusterPaths("dev"), ClusterOptions(digest="hmac-sha256"),
                          clock=SYSTEM_CLOCK.now, secret=read_secret("/etc/fencepost/secret"))
    # in a member:
    config = join_cluster(zk, paths, {"write_quorum": 3, "digest": None}, cluster="dev",
                          init_if_missing=False, clock=SYSTEM_CLOCK.now, stop=stop_event)
    secret = check_member_secret(config, secret, "dev")
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from election import ElectionError
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from election.shards import check_shards
from election.task_settings import CONFIG_KEY as TASK_SETTINGS_KEY
from election.task_settings import checked as checked_settings
from election.task_settings import defaults as task_defaults
from election.zk import patiently

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
DIGESTS = ("crc32c", "hmac-sha256")
MAX_PAYLOAD_LIMIT = 64 * 1024 * 1024
# The options a member may set and must then agree with `config` on (format_version is not one).
SHARED_OPTIONS = ("write_quorum", "ack_quorum", "ensemble_size", "digest", "max_payload_bytes")
# How often a member waiting for `cluster init` looks again when no watch has fired (a lost session).
WAIT_POLL_S = 1.0


class ConfigMismatch(ElectionError):
    """This member's options differ from the cluster's; ``differences`` names each."""

    def __init__(self, differences: list[str]) -> None:
        super().__init__("options differ from the cluster's: " + "; ".join(differences))
        self.differences = differences


class ClusterAlreadyInitialized(ElectionError):
    """`cluster init` found a `config` node: the cluster exists (``cluster_id``)."""

    def __init__(self, cluster: str, cluster_id: str) -> None:
        super().__init__(f"cluster {cluster!r} is already initialized (cluster id {cluster_id})")
        self.cluster_id = cluster_id


class SecretError(ElectionError):
    """The cluster secret is missing, unreadable, empty, not needed, or not the cluster's."""


@dataclass(frozen=True)
class ClusterOptions:
    """Options that must be identical on every member of a cluster."""

    write_quorum: int = 3
    ack_quorum: int = 2
    ensemble_size: int = 3
    digest: str = "crc32c"
    max_payload_bytes: int = 1024 * 1024
    format_version: int = FORMAT_VERSION

    @classmethod
    def with_overrides(cls, overrides: Mapping[str, Any]) -> "ClusterOptions":
        """The defaults, with each option of ``overrides`` that is not None in its place."""
        return cls(**{k: v for k, v in overrides.items() if v is not None and k in SHARED_OPTIONS})

    def validate(self) -> "ClusterOptions":
        if not 1 <= self.ack_quorum <= self.write_quorum <= self.ensemble_size:
            raise ElectionError(
                "need 1 <= ack_quorum <= write_quorum <= ensemble_size, got "
                f"{self.ack_quorum}/{self.write_quorum}/{self.ensemble_size}"
            )
        if self.write_quorum != self.ensemble_size:
            raise ElectionError("striping is not supported: write_quorum must equal ensemble_size")
        if self.digest not in DIGESTS:
            raise ElectionError(f"digest must be one of {', '.join(DIGESTS)}, got {self.digest!r}")
        if not 1 <= self.max_payload_bytes <= MAX_PAYLOAD_LIMIT:
            raise ElectionError("max_payload_bytes must be between 1 and 64 MiB")
        return self

    def differences(self, config: Mapping[str, Any]) -> list[str]:
        """Each option whose value in `config` differs from ours (all of ours are set)."""
        return option_differences(config, asdict(self))


def option_differences(config: Mapping[str, Any], mine: Mapping[str, Any]) -> list[str]:
    """Each option set in ``mine`` (not None) whose value in ``config`` differs, as readable text.

    An option left unset takes the cluster's value, so it never differs::

        option_differences({"write_quorum": 3, "ack_quorum": 2}, {"write_quorum": 2, "ack_quorum": None})
        # ["write_quorum: cluster has 3, this member has 2"]
    """
    out = []
    for name, value in mine.items():
        if value is None:
            continue
        theirs = config.get(name)
        if theirs != value:
            out.append(f"{name}: cluster has {_show(theirs)}, this member has {_show(value)}")
    return out


def _show(value: Any) -> str:
    return "nothing" if value is None else str(value)


def member_options(config: object) -> dict[str, Any]:
    """The shared options a member's config dataclass sets (None: take the cluster's)."""
    return {name: getattr(config, name, None) for name in SHARED_OPTIONS}


def cluster_option_field(name: str) -> Any:
    """The dataclass field of one shared option in a member's config (``BrokerConfig``, ``BookieConfig``).

    Declared here once so that brokers and bookies describe them alike; the
    metadata is the generated command-line option's (see ``commands/options.py``).
    """
    helps = {
        "write_quorum": ("Bookies each entry is written to; must match the cluster's.", {"min": 1}),
        "ack_quorum": ("Acks that commit an entry; must match the cluster's.", {"min": 1}),
        "ensemble_size": ("Bookies per ledger; must match the cluster's.", {"min": 1}),
        "digest": ("Entry digest, crc32c or hmac-sha256; must match the cluster's.", {"choices": DIGESTS}),
        "max_payload_bytes": (
            "Largest task payload; must match the cluster's.",
            {"min": 1, "max": MAX_PAYLOAD_LIMIT, "unit": "bytes"},
        ),
    }
    text, extra = helps[name]
    return field(default=None, metadata={"help": text, "default_text": "the cluster's", **extra})


def init_if_missing_field() -> Any:
    """The ``init_if_missing`` field of a member's config (see :func:`join_cluster`)."""
    return field(
        default=False,
        metadata={
            "help": "Create the cluster's config with this member's (or the default) options if "
            "`fencepost cluster init` has not run, instead of waiting for it (dev clusters, tests)."
        },
    )


def validate_member_options(config: object, error: type[Exception]) -> None:
    """Range checks of the shared options a member sets; raise ``error`` naming the first bad one."""
    for name in ("write_quorum", "ack_quorum", "ensemble_size", "max_payload_bytes"):
        value = getattr(config, name, None)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise error(f"{name} must be an integer of at least 1, got {value!r}")
    payload = getattr(config, "max_payload_bytes", None)
    if payload is not None and payload > MAX_PAYLOAD_LIMIT:
        raise error("max_payload_bytes must be between 1 and 64 MiB")
    digest = getattr(config, "digest", None)
    if digest is not None and digest not in DIGESTS:
        raise error(f"digest must be one of {', '.join(DIGESTS)}, got {digest!r}")


# ------------------------------------------------------------------ the secret
def read_secret(path: str | Path) -> bytes:
    """The cluster secret in ``path`` (surrounding whitespace stripped); :class:`SecretError` if unusable.

    The message names the file, never its content.
    """
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as exc:
        raise SecretError(f"cannot read the secret file {path}: {exc.strerror or exc}") from None
    if not secret:
        raise SecretError(f"the secret file {path} is empty")
    return secret


def secret_check(secret: bytes, cluster_id: str) -> str:
    """What `config` keeps to recognize the secret: an HMAC of the cluster id, not the secret."""
    return hmac.new(secret, b"fencepost secret check " + cluster_id.encode(), hashlib.sha256).hexdigest()


def check_member_secret(
    config: Mapping[str, Any], secret: bytes | None, cluster: str, source: str = "--secret-file"
) -> bytes | None:
    """The secret this member keys digests with: None for ``crc32c``; for ``hmac-sha256``
    ``secret``, which must be there and, where `config` can tell, the cluster's.

    Raises :class:`SecretError` naming what is wrong (never the secret).
    """
    if config.get("digest") != "hmac-sha256":
        return None
    if not secret:
        raise SecretError(
            f"cluster {cluster!r} uses the hmac-sha256 digest: "
            "this member needs --secret-file with the cluster secret"
        )
    expected = config.get("secret_check")
    if expected is not None and not hmac.compare_digest(expected, secret_check(secret, config["cluster_id"])):
        raise SecretError(
            f"the secret in {source} is not the secret of cluster {cluster!r} ({config['cluster_id']})"
        )
    return secret


def check_secret_choice(options: ClusterOptions, secret: bytes | None) -> None:
    """A secret goes with the ``hmac-sha256`` digest and with nothing else (:class:`SecretError`)."""
    if options.digest == "hmac-sha256" and not secret:
        raise SecretError("the hmac-sha256 digest needs the cluster secret: give --secret-file")
    if options.digest != "hmac-sha256" and secret:
        raise SecretError(f"--secret-file is only used with --digest hmac-sha256, not {options.digest}")


# ------------------------------------------------------------------ the node
def new_config(
    options: ClusterOptions,
    clock: Callable[[], float],
    secret: bytes | None = None,
    shards: int = 1,
    task_settings: Mapping[str, Any] | None = None,
) -> dict:
    """The content of a fresh `config` node (the secret only as its ``secret_check``; ``shards``
    only when above 1; with ``task_settings`` every task setting, the defaults where it names
    none; without, none: a bookie's, which the first broker to start completes with its options)."""
    check_secret_choice(options.validate(), secret)
    config = {"cluster_id": str(uuid.uuid4()), "created_at": clock(), **asdict(options)}
    if task_settings is not None:
        config[TASK_SETTINGS_KEY] = {**task_defaults(), **checked_settings(task_settings)}
    if check_shards(shards) > 1:
        config["shards"] = shards
    if secret:
        config["secret_check"] = secret_check(secret, config["cluster_id"])
    return config


def cluster_shards(config: Mapping[str, Any]) -> int:
    """How many shards the cluster of ``config`` has (1 when the config does not say: every cluster
    made before shards); ElectionError for a value no ``cluster init`` writes."""
    return check_shards(config.get("shards", 1))


def read_cluster_config(zk: KazooClient, paths: ClusterPaths) -> dict | None:
    """The cluster's config, or None if the cluster was never initialized."""
    try:
        data, _ = zk.get(paths.config)
    except NoNodeError:
        return None
    return json.loads(data)


def init_cluster(
    zk: KazooClient,
    paths: ClusterPaths,
    options: ClusterOptions,
    clock: Callable[[], float],
    secret: bytes | None = None,
    shards: int = 1,
    task_settings: Mapping[str, Any] | None = None,
) -> dict:
    """Create the `config` node (`fencepost cluster init`) and return it.

    Raises :class:`ClusterAlreadyInitialized` if it exists (ZooKeeper settles
    two inits at once: one creates, the other is refused), :class:`SecretError`
    for a digest without its secret or a secret without its digest, and
    ElectionError for options out of range.
    """
    config = new_config(options, clock, secret, shards, task_settings or {})
    zk.ensure_path(paths.base)
    try:
        zk.create(paths.config, json.dumps(config).encode())
    except NodeExistsError:
        existing = read_cluster_config(zk, paths) or {}
        raise ClusterAlreadyInitialized(paths.cluster, existing.get("cluster_id", "unknown")) from None
    return config


def ensure_cluster_config(
    zk: KazooClient,
    paths: ClusterPaths,
    options: ClusterOptions,
    clock: Callable[[], float],
    check: bool = True,
    secret: bytes | None = None,
    task_settings: Mapping[str, Any] | None = None,
) -> dict:
    """Create the config node if absent, then return it (a member's ``--init-if-missing``).

    With ``check`` the options are compared and :class:`ConfigMismatch` names
    every difference. Creation races are settled by ZooKeeper: the loser reads
    what the winner wrote.
    """
    options.validate()
    config = read_cluster_config(zk, paths)
    if config is None:
        secret = secret if options.digest == "hmac-sha256" else None
        fresh = new_config(options, clock, secret, task_settings=task_settings)
        zk.ensure_path(paths.base)
        try:
            zk.create(paths.config, json.dumps(fresh).encode())
            config = fresh
        except NodeExistsError:
            config = read_cluster_config(zk, paths)
    if check:
        differences = options.differences(config)
        if differences:
            raise ConfigMismatch(differences)
    return config


def wait_for_cluster_config(
    zk: KazooClient,
    paths: ClusterPaths,
    stop: threading.Event,
    poll_s: float = WAIT_POLL_S,
    clock: Clock = SYSTEM_CLOCK,
) -> dict | None:
    """Block until the `config` node exists and return it; None once ``stop`` is set.

    A watch wakes the wait as soon as the node is created; the bounded poll
    covers a watch lost with the session and notices ``stop`` within 0.1 s.
    ZooKeeper being away only prolongs the wait.
    """
    appeared = threading.Event()

    def wake(_event: Any) -> None:
        appeared.set()

    while not stop.is_set():
        appeared.clear()
        try:
            # The same function each time: kazoo keeps a set of watchers, so re-arming adds none.
            if zk.exists(paths.config, watch=wake) is not None:
                config = read_cluster_config(zk, paths)
                if config is not None:
                    return config
        except (KazooException, KazooTimeoutError) as exc:
            log.debug("waiting for the cluster config: %s", exc)
        for _ in range(max(1, int(poll_s / 0.1))):
            if clock.wait(appeared, 0.1) or stop.is_set():
                break
    return None


def join_cluster(
    zk: KazooClient,
    paths: ClusterPaths,
    mine: Mapping[str, Any],
    *,
    cluster: str,
    init_if_missing: bool,
    clock: Callable[[], float],
    stop: threading.Event,
    secret: bytes | None = None,
    task_settings: Mapping[str, Any] | None = None,
) -> dict | None:
    """The cluster's config as a member starting up sees it; None if ``stop`` was set while waiting.

    ``mine`` maps each shared option to the member's value or None ("take the
    cluster's"). Without the node: with ``init_if_missing`` create it from
    ``mine`` and the defaults (``secret`` gives an hmac cluster its
    ``secret_check``, a broker's ``task_settings`` its own options), else log one line and wait
    for `fencepost cluster init`.
    Then every set option is compared: :class:`ConfigMismatch` names each difference.
    """
    config = patiently(read_cluster_config, zk, paths, what="reading the cluster config")
    if config is None and init_if_missing:
        options = ClusterOptions.with_overrides(mine)
        config = patiently(
            ensure_cluster_config,
            zk,
            paths,
            options,
            clock=clock,
            check=False,
            secret=secret,
            task_settings=task_settings,
            what="creating the cluster config",
        )
    elif config is None:
        log.info("waiting for `fencepost cluster init` of cluster %s", cluster)
        config = wait_for_cluster_config(zk, paths, stop)
        if config is None:
            return None
        log.info("cluster %s initialized (cluster id %s): going on", cluster, config["cluster_id"])
    differences = option_differences(config, mine)
    if differences:
        raise ConfigMismatch(differences)
    return config
