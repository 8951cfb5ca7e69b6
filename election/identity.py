"""Persistent broker ids (docs/architecture.md, "ZooKeeper layout"; after RocketMQ's persistent unique BrokerId).

A broker is `cluster:name:id`, never its address. The id is agreed with
ZooKeeper in steps that each survive a crash:

1. read ``brokers/next_id``;
2. write ``<data>/.broker.meta.temp`` with a random register code, fsynced;
3. in one multi-op, create ``brokers/ids/N`` with that code and move
   ``next_id`` on (CAS on its version); an existing ``ids/N`` with our code
   means step 3 already happened; another code means the id is taken: drop
   the temp file and start again;
4. replace the temp file by ``<data>/.broker.meta`` (write, fsync, rename,
   fsync the directory);
5. record the address in ``brokers/ids/N``.

A restart with ``.broker.meta`` goes to 5, one with only the temp file to 3.

The processes a broker starts for its other shards only read the id it established
(:func:`read_identity`): they never register one.

Example::

    identity = ensure_broker_id(zk, ClusterPaths("dev"), Path("data"), "broker-a",
                                "tcp://127.0.0.1:5555", clock=SYSTEM_CLOCK.now)
    identity.broker_id
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from election import ElectionError
from election.local.files import write_json_atomically
from election.paths import ClusterPaths

log = logging.getLogger(__name__)

META = ".broker.meta"
META_TEMP = ".broker.meta.temp"


class IdentityError(ElectionError):
    """The broker's identity could not be established or does not match."""


@dataclass(frozen=True)
class BrokerIdentity:
    cluster: str
    name: str
    broker_id: int
    register_code: str

    def __str__(self) -> str:
        return f"{self.cluster}:{self.name}:{self.broker_id}"


# The fields of `.broker.meta` and the type each must have.
META_FIELDS = (("cluster", str), ("name", str), ("broker_id", int), ("register_code", str))


def _read_meta(path: Path) -> dict | None:
    """The identity document at `path`, None if absent; IdentityError naming the file and
    the field when it is damaged."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise IdentityError(
            f"{path} is unreadable ({exc.strerror}); restore it or remove the data dir"
        ) from None
    try:
        doc = json.loads(raw)
    except ValueError:
        # A torn temp file is harmless: it was never applied. A torn final file cannot
        # happen (rename is atomic), so refuse it loudly rather than guess.
        if path.name == META_TEMP:
            return None
        raise IdentityError(f"{path} is not valid JSON; restore it or remove the data dir") from None
    if not isinstance(doc, dict):
        raise IdentityError(f"{path} is not a JSON object; restore it or remove the data dir")
    for field, kind in META_FIELDS:
        value = doc.get(field)
        # bool is an int to Python, never a broker id.
        if (
            not isinstance(value, kind)
            or isinstance(value, bool)
            or value in ("", None)
            or (kind is int and value < 0)
        ):
            what = "missing" if field not in doc else f"{value!r:.40} is not a valid {kind.__name__}"
            raise IdentityError(f"{path}: field {field!r} {what}; restore it or remove the data dir")
    return doc


def _identity(doc: dict) -> BrokerIdentity:
    return BrokerIdentity(doc["cluster"], doc["name"], doc["broker_id"], doc["register_code"])


def _next_id(zk: KazooClient, paths: ClusterPaths) -> tuple[int, int]:
    zk.ensure_path(paths.broker_ids)
    try:
        zk.create(paths.next_broker_id, b"1")
    except NodeExistsError:
        pass
    data, stat = zk.get(paths.next_broker_id)
    return int(data), stat.version


def raise_next_id(zk: KazooClient, paths: ClusterPaths, floor: int) -> int:
    """Move ``brokers/next_id`` up to ``floor`` (never down, CAS); return its value now.

    A cluster restarting without its ZooKeeper data does this before a member without an id
    applies for one (:mod:`election.id_gate`): ids below ``floor`` belong to kept stores.
    """
    while True:
        value, version = _next_id(zk, paths)
        if value >= floor:
            return value
        try:
            zk.set(paths.next_broker_id, str(floor).encode(), version=version)
            return floor
        except BadVersionError:
            continue


def _apply_id(zk: KazooClient, paths: ClusterPaths, doc: dict, next_version: int | None, clock) -> bool:
    """Step 3: claim ids/N with our code; True if it is ours."""
    node = paths.broker_id(doc["broker_id"])
    record = json.dumps(
        {"name": doc["name"], "register_code": doc["register_code"], "address": None, "updated_at": clock()}
    ).encode()
    if next_version is not None:
        tx = zk.transaction()
        tx.create(node, record)
        tx.set_data(paths.next_broker_id, str(doc["broker_id"] + 1).encode(), version=next_version)
        results = tx.commit()
        if not any(isinstance(r, Exception) for r in results):
            return True
    try:
        data, _ = zk.get(node)
    except NoNodeError:
        return False
    return json.loads(data).get("register_code") == doc["register_code"]


def _reregister(
    zk: KazooClient, paths: ClusterPaths, identity: BrokerIdentity, clock, max_tries: int = 20
) -> None:
    """ZooKeeper lost ``ids/N`` (its data was re-created): claim it again with the code kept in
    ``.broker.meta``, moving ``next_id`` past N in the same multi-op so that no newcomer gets N."""
    n = identity.broker_id
    doc = {"name": identity.name, "broker_id": n, "register_code": identity.register_code}
    record = json.dumps(
        {
            "name": identity.name,
            "register_code": identity.register_code,
            "address": None,
            "updated_at": clock(),
        }
    ).encode()
    for _ in range(max_tries):
        next_id, version = _next_id(zk, paths)
        if next_id > n:
            try:
                zk.create(paths.broker_id(n), record)
            except NodeExistsError:
                pass  # compared below
            break
        if _apply_id(zk, paths, doc, version, clock) or zk.exists(paths.broker_id(n)):
            break
    else:
        raise IdentityError(f"could not register broker id {n} again (next_id keeps changing)")
    if json.loads(zk.get(paths.broker_id(n))[0]).get("register_code") != identity.register_code:
        raise IdentityError(f"broker id {n} belongs to another broker (register code differs)")
    log.warning(
        "broker id %d was not registered in ZooKeeper (its data was lost or re-created): "
        "registered it again from .broker.meta",
        n,
    )


def _register(zk: KazooClient, paths: ClusterPaths, identity: BrokerIdentity, address: str, clock) -> None:
    """Step 5: record our address; the record must still carry our code."""
    node = paths.broker_id(identity.broker_id)
    try:
        data, stat = zk.get(node)
    except NoNodeError:
        _reregister(zk, paths, identity, clock)
        data, stat = zk.get(node)
    record = json.loads(data)
    if record.get("register_code") != identity.register_code:
        raise IdentityError(
            f"broker id {identity.broker_id} belongs to another broker (register code differs)"
        )
    record.update(address=address, updated_at=clock(), name=identity.name)
    try:
        zk.set(node, json.dumps(record).encode(), version=stat.version)
    except BadVersionError:
        raise IdentityError(f"broker id {identity.broker_id} changed while registering; retry") from None


def read_identity(data_dir: Path, cluster: str) -> BrokerIdentity | None:
    """The identity ``data_dir`` holds (None before it has one), without touching ZooKeeper."""
    doc = _read_meta(Path(data_dir) / META)
    if doc is None:
        return None
    if doc["cluster"] != cluster:
        raise IdentityError(f"{data_dir} belongs to cluster {doc['cluster']!r}, not {cluster!r}")
    return _identity(doc)


def ensure_broker_id(
    zk: KazooClient,
    paths: ClusterPaths,
    data_dir: Path,
    name: str,
    address: str,
    clock: Callable[[], float],
    max_tries: int = 20,
) -> BrokerIdentity:
    """Return this data dir's broker identity, establishing it on first start."""
    data_dir.mkdir(parents=True, exist_ok=True)
    final_path, temp_path = data_dir / META, data_dir / META_TEMP
    doc = _read_meta(final_path)
    if doc is not None:
        if doc["cluster"] != paths.cluster:
            raise IdentityError(f"{data_dir} belongs to cluster {doc['cluster']!r}, not {paths.cluster!r}")
        identity = _identity(doc)
        _register(zk, paths, identity, address, clock)
        return identity
    for _ in range(max_tries):
        doc = _read_meta(temp_path)
        next_version = None
        if doc is None or doc["cluster"] != paths.cluster:
            broker_id, next_version = _next_id(zk, paths)
            doc = {
                "cluster": paths.cluster,
                "name": name,
                "broker_id": broker_id,
                "register_code": secrets.token_hex(16),
            }
            write_json_atomically(temp_path, doc)
        if _apply_id(zk, paths, doc, next_version, clock):
            write_json_atomically(final_path, doc)
            temp_path.unlink(missing_ok=True)
            identity = _identity(doc)
            _register(zk, paths, identity, address, clock)
            return identity
        temp_path.unlink(missing_ok=True)
    raise IdentityError(f"could not obtain a broker id after {max_tries} tries (heavy contention?)")
