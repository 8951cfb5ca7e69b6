"""The options every command that talks to a cluster shares, and options generated from config dataclasses.

Which cluster a command talks to: ``cluster_options`` (``--zk/--cluster/--dev-dir``, the ZooKeeper
credential and a secure cluster's keys) and :func:`resolve_cluster` (flags, then the environment,
then the dev cluster's record, :mod:`election.local.dev_cluster`, with a secure dev cluster's admin
key); :func:`with_zk` for a short ZooKeeper session, :func:`make_client` for a client.

Generated options: a setting of a process's config dataclass is declared once.

Each field of the dataclass (``BrokerConfig``, ``BookieConfig``) becomes one option named after
it (``zk_session_timeout_s`` -> ``--zk-session-timeout-s``). What the option needs beyond the
field's name, type and default lives in the field's metadata (declared with
:func:`election.local.member_config.setting`):

- ``help``: the option's help text (for a bool field: what the flag does);
- ``default_text``: how the default reads in the help, where its value would not say it
  (``"256 MiB"``, ``"the data dir's name"``); an empty default with none is not shown;
- ``min``, ``max`` and ``min_open``: the range of values the option accepts (an integer or
  float range; the config's ``validate`` checks the same range for values from elsewhere);
- ``path``: ``"dir"`` or ``"file"`` for a path option;
- ``choices``: the values a string option accepts (anything else is a usage error).

A bool field defaulting to true becomes ``--no-<name>``, one defaulting to false ``--<name>``.
Each former name of a renamed field (the class's ``former_names``, old -> new) becomes a hidden
option of the old spelling (``--zk-session-timeout``); its value reaches ``load_settings`` under
the old name, which sets the new field and logs a deprecation warning naming the new option.
Every option defaults to None, and :func:`settings_flags` keeps an absent flag out of the
flags, so ``FENCEPOST_<FIELD>``, ``fencepost.toml`` and the dataclass default still apply
(:func:`election.local.settings.load_settings`).

Example::

    @broker_group.command("start")
    @config_options(BrokerConfig, skip=("zk", "cluster"))   # those come from cluster_options
    @cluster_options
    def broker_start(config_file, zk, cluster, dev_dir, **settings):
        flags = settings_flags(BrokerConfig, settings)
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from pathlib import Path
from typing import Any, Callable, Iterable

import click

from commands.checks import check_zk_hosts, check_zk_resolvable
from commands.errors import quiet_kazoo
from election.local.dev_cluster import DEFAULT_DEV_DIR, STATE_FILE, read_dev_state
from election.local.settings import ENV_PREFIX
from election.zk_auth import ENV as ZK_AUTH_ENV
from election.zk_auth import ZkAuth, ZkAuthError


def resolve_cluster(zk: str | None, cluster: str | None, dev_dir: str) -> tuple[str, str]:
    """ZooKeeper hosts and cluster name: flags, then FENCEPOST_ZK/FENCEPOST_CLUSTER, then the dev cluster.

    Hosts that cannot be right (``notahost:abc``) are a usage error naming where they came from.
    """
    source = "--zk" if zk else "FENCEPOST_ZK"
    zk = zk or os.environ.get("FENCEPOST_ZK")
    cluster = cluster or os.environ.get("FENCEPOST_CLUSTER")
    if zk and cluster:
        return check_zk_hosts(zk, source), cluster
    state = read_dev_state(dev_dir)
    if not zk:
        if not state:
            raise click.UsageError(f"no --zk given, FENCEPOST_ZK unset, and no dev cluster in {dev_dir}")
        zk, source = state["zk"], f"{dev_dir}/{STATE_FILE}"
        use_dev_keys(state)
    return check_zk_hosts(zk, source), cluster or (state or {}).get("cluster") or "dev"


def with_zk(zk, cluster, dev_dir, action, must_exist: bool = True):
    """Run ``action(kazoo_client, cluster_name)`` on a short ZooKeeper session to the resolved cluster.

    kazoo's connection-retry warnings are kept quiet (unless --log-level debug): a command that
    cannot reach ZooKeeper fails with one line, not a warning per retry. A cluster ZooKeeper holds
    no root for fails at once (``must_exist``; `cluster init` is the one command that creates it).
    """
    from broker.api.target import check_cluster_exists
    from election.zk import close, connect

    hosts, name = resolve_cluster(zk, cluster, dev_dir)
    check_zk_resolvable(hosts)
    quiet_kazoo()
    client = connect(hosts, connect_timeout=5.0)
    try:
        if must_exist:
            check_cluster_exists(client, name, hosts)
        return action(client, name)
    finally:
        close(client)


def make_client(zk, cluster, dev_dir, timeout: float = 30.0):
    """A :class:`broker.api.client.Client` of the resolved cluster, for a command that runs once."""
    from broker.api.client import Client

    hosts, name = resolve_cluster(zk, cluster, dev_dir)
    check_zk_resolvable(hosts)
    quiet_kazoo()
    return Client(zk=hosts, cluster=name, timeout=timeout)


def _zk_auth(_ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    # Exported, so that every ZooKeeper session of this process and of the processes it starts carries it.
    if value:
        try:
            ZkAuth.parse(value)
        except ZkAuthError as exc:
            raise click.BadParameter(str(exc)) from None
        os.environ[ZK_AUTH_ENV] = value


def _key_option(env_name: str) -> Callable[[click.Context, click.Parameter, str | None], None]:
    # Exported like --zk-auth: the process's bookie pools, one-off requests and clients connect with it.
    def callback(_ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
        if value:
            os.environ[env_name] = str(Path(value).resolve())

    return callback


def use_dev_keys(state: dict) -> None:
    """A secure dev cluster's admin key and keys file, unless --key-file/--keys-file or the environment say."""
    from election.secure.keyring import ENV_KEY_FILE, ENV_KEYS_FILE

    if state.get("admin_key_file") and not (os.environ.get(ENV_KEY_FILE) or os.environ.get(ENV_KEYS_FILE)):
        os.environ[ENV_KEY_FILE] = state["admin_key_file"]
        os.environ[ENV_KEYS_FILE] = state["keys_file"]


def cluster_options(fn):
    """--zk/--cluster/--dev-dir/--zk-auth/--key-file/--keys-file, shared by every command that talks to a cluster."""
    fn = click.option(
        "--keys-file",
        default=None,
        expose_value=False,
        callback=_key_option("FENCEPOST_KEYS_FILE"),
        type=click.Path(dir_okay=False),
        help="A secure cluster's keys file: the servers' public keys, pinned by address "
        "[env FENCEPOST_KEYS_FILE; default: a secure dev cluster's].",
    )(fn)
    fn = click.option(
        "--key-file",
        default=None,
        expose_value=False,
        callback=_key_option("FENCEPOST_KEY_FILE"),
        type=click.Path(dir_okay=False),
        help="Secret key file to connect to a secure cluster with (`fencepost keys new`); for "
        "`broker start` and `bookie start`, the server's own key [env FENCEPOST_KEY_FILE; "
        "default: a secure dev cluster's admin key].",
    )(fn)
    fn = click.option(
        "--zk-auth",
        default=None,
        expose_value=False,
        callback=_zk_auth,
        metavar="digest:USER:FILE",
        help="ZooKeeper digest credential, the password read from FILE: every node created gets an "
        "ACL for USER only [env FENCEPOST_ZK_AUTH].",
    )(fn)
    fn = click.option(
        "--dev-dir",
        default=DEFAULT_DEV_DIR,
        show_default=True,
        help="Dev cluster to use when neither --zk nor FENCEPOST_ZK is set.",
    )(fn)
    fn = click.option(
        "--cluster",
        default=None,
        help="Cluster name [env FENCEPOST_CLUSTER; default: the dev cluster's, else dev].",
    )(fn)
    fn = click.option("--zk", default=None, help="ZooKeeper hosts host:port,... [env FENCEPOST_ZK].")(fn)
    return fn


def _base_type(hint: Any) -> Any:
    """``str | None`` -> ``str``; other hints unchanged."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _param_name(field: dataclasses.Field, base: Any) -> str:
    # A true-by-default bool is turned off by its flag, so the flag is named for that.
    return f"no_{field.name}" if base is bool and field.default is True else field.name


def option_name(field: dataclasses.Field, hint: Any) -> str:
    """The command-line name of ``field``'s option, e.g. ``--no-fsync``."""
    return "--" + _param_name(field, _base_type(hint)).replace("_", "-")


def _default_text(field: dataclasses.Field, base: Any) -> str | None:
    text = field.metadata.get("default_text")
    if text is not None:
        return text
    if base is bool or field.default in (None, "") or field.default is dataclasses.MISSING:
        return None
    return str(field.default)


def _click_type(field: dataclasses.Field, base: Any) -> Any:
    low, high = field.metadata.get("min"), field.metadata.get("max")
    path = field.metadata.get("path")
    if field.metadata.get("choices") is not None:
        return click.Choice(list(field.metadata["choices"]))
    if path is not None:
        return click.Path(file_okay=path != "dir", dir_okay=path != "file")
    if base in (int, float) and (low is not None or high is not None):
        kind = click.IntRange if base is int else click.FloatRange
        return kind(low, high, min_open=bool(field.metadata.get("min_open")))
    if base in (int, float):
        return base
    return str


def _former_options(cls: type, hints: dict[str, Any], skipped: set[str]) -> list[Callable]:
    """A hidden option for each former name of a field of ``cls`` (see the module docstring)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    decorators = []
    for old, new in getattr(cls, "former_names", {}).items():
        if new in skipped:
            continue
        base = _base_type(hints[new])
        if base is bool:
            raise TypeError(f"{cls.__name__}.{new}: a renamed flag keeps no old spelling")
        old_option = "--" + old.replace("_", "-")
        decorators.append(
            click.option(old_option, old, type=_click_type(fields[new], base), default=None, hidden=True)
        )
    return decorators


def config_options(cls: type, skip: Iterable[str] = ()) -> Callable[[Callable], Callable]:
    """A decorator adding one option per field of ``cls`` (except ``skip``), in field order."""
    hints = typing.get_type_hints(cls)
    skipped = set(skip)
    decorators = []
    for field in dataclasses.fields(cls):
        if field.name in skipped:
            continue
        if "help" not in field.metadata:
            raise TypeError(f"{cls.__name__}.{field.name} has no help text in its metadata")
        base = _base_type(hints[field.name])
        notes = [f"env {ENV_PREFIX}{field.name.upper()}"]
        shown = _default_text(field, base)
        if shown is not None:
            notes.append(f"default {shown}")
        help_text = f"{field.metadata['help']} [{'; '.join(notes)}]"
        name = option_name(field, hints[field.name])
        if base is bool:
            decorators.append(
                click.option(name, _param_name(field, base), is_flag=True, default=None, help=help_text)
            )
        else:
            decorators.append(
                click.option(name, field.name, type=_click_type(field, base), default=None, help=help_text)
            )
    decorators += _former_options(cls, hints, skipped)

    def apply(fn: Callable) -> Callable:
        # click lists options in the order their decorators are applied, innermost last.
        for decorator in reversed(decorators):
            fn = decorator(fn)
        return fn

    return apply


def settings_flags(cls: type, params: dict[str, Any]) -> dict[str, Any]:
    """The ``flags`` for ``load_settings`` from a command's generated options (None: not given).

    An old spelling that was given stays under its old name, for ``load_settings`` to warn about.
    """
    hints = typing.get_type_hints(cls)
    flags: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        base = _base_type(hints[field.name])
        param = _param_name(field, base)
        if param not in params:
            continue
        value = params[param]
        if base is bool:
            # A flag only ever says "the non-default": absent means "let env/TOML decide".
            value = (not field.default) if value else None
        flags[field.name] = value
    for old in getattr(cls, "former_names", {}):
        if params.get(old) is not None:
            flags[old] = params[old]  # load_settings warns and sets the renamed field
    return flags
