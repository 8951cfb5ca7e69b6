"""A broker store's signatures: ``<data>/store.status`` (docs/architecture.md, "Cluster life").

The file says which cluster a store belongs to and whether the whole cluster
was stopped in order when it was last used::

    {"cluster_id": .., "created_at": .., "state": "clean" | "dirty",
     "shutdown_id": .. or null, "position": [ledger, entry] or null}

- The **initial signature** is ``(cluster_id, created_at)``: written when the
  store is created and never changed afterwards.
- The state is ``dirty`` from the moment a broker starts on the store; only an
  orderly whole-cluster shutdown (``fencepost cluster shutdown``) makes it
  ``clean``, together with the **final signature** ``(shutdown_id, position)``:
  the ``ClusterShutdown`` entry every member stopped at. Two clean stores with
  the same final signature hold the same state.

Every write is whole or nothing (temp file, fsync, rename, fsync the directory),
so a crash leaves the old document or the new one. A damaged file is named,
never guessed at.

Example::

    status = ensure_status(data_dir, cluster_id, created_at=SYSTEM_CLOCK.now())
    mark_dirty(data_dir)                                  # a broker runs on it
    mark_clean(data_dir, "c5f0..", (7, 1042))             # orderly cluster shutdown
    read_status(data_dir).final_signature                 # ("c5f0..", (7, 1042))
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from election import ElectionError
from election.local.files import write_json_atomically

STATUS_NAME = "store.status"
CLEAN = "clean"
DIRTY = "dirty"
STATES = (CLEAN, DIRTY)


class StoreStatusError(ElectionError):
    """``store.status`` is unreadable or malformed (the message names the file and the field)."""


@dataclass(frozen=True)
class StoreStatus:
    """The signatures of one store; see the module docstring for their meaning."""

    cluster_id: str
    created_at: float
    state: str = DIRTY
    shutdown_id: str | None = None
    position: tuple[int, int] | None = None

    @property
    def clean(self) -> bool:
        return self.state == CLEAN

    @property
    def initial_signature(self) -> tuple[str, float]:
        return self.cluster_id, self.created_at

    @property
    def final_signature(self) -> tuple[str, tuple[int, int] | None] | None:
        """``(shutdown_id, position)`` of a clean store, None for a dirty one."""
        return (self.shutdown_id, self.position) if self.clean else None

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["position"] = list(self.position) if self.position is not None else None
        return doc


def status_path(data_dir: str | os.PathLike) -> Path:
    return Path(data_dir) / STATUS_NAME


def _parse(path: Path, doc: object) -> StoreStatus:
    if not isinstance(doc, dict):
        raise StoreStatusError(f"{path} is not a JSON object")

    def bad(field: str) -> StoreStatusError:
        what = "missing" if field not in doc else f"{doc[field]!r:.60} is not valid"
        return StoreStatusError(f"{path}: field {field!r} {what}")

    cluster_id, created_at, state = doc.get("cluster_id"), doc.get("created_at"), doc.get("state")
    shutdown_id, position = doc.get("shutdown_id"), doc.get("position")
    if not isinstance(cluster_id, str) or not cluster_id:
        raise bad("cluster_id")
    if isinstance(created_at, bool) or not isinstance(created_at, (int, float)):
        raise bad("created_at")
    if state not in STATES:
        raise bad("state")
    if shutdown_id is not None and (not isinstance(shutdown_id, str) or not shutdown_id):
        raise bad("shutdown_id")
    if position is not None:
        if (
            not isinstance(position, list)
            or len(position) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in position)
        ):
            raise bad("position")
        position = (position[0], position[1])
    if state == CLEAN and shutdown_id is None:
        raise StoreStatusError(f"{path}: a clean store must name the shutdown it stopped at (shutdown_id)")
    return StoreStatus(cluster_id, float(created_at), state, shutdown_id, position)


def read_status(data_dir: str | os.PathLike) -> StoreStatus | None:
    """The status of the store in ``data_dir``; None when the file does not exist."""
    path = status_path(data_dir)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreStatusError(f"{path} is unreadable ({exc.strerror})") from None
    try:
        doc = json.loads(raw)
    except ValueError:
        raise StoreStatusError(f"{path} is not valid JSON") from None
    return _parse(path, doc)


def write_status(data_dir: str | os.PathLike, status: StoreStatus) -> StoreStatus:
    """Replace the status file whole (temp file, fsync, rename, fsync the directory)."""
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    write_json_atomically(status_path(data_dir), status.to_json(), sort_keys=True, indent=1)
    return status


def ensure_status(data_dir: str | os.PathLike, cluster_id: str, created_at: float) -> StoreStatus:
    """The store's status, written with its initial signature if it has none yet.

    An existing file is returned unchanged: the initial signature is never rewritten
    (a store of another cluster is refused by the caller, not re-signed).
    """
    status = read_status(data_dir)
    if status is None:
        status = write_status(data_dir, StoreStatus(cluster_id, created_at))
    return status


def mark_dirty(data_dir: str | os.PathLike) -> StoreStatus:
    """A broker is about to run on the store: it is no longer known to be clean."""
    status = read_status(data_dir)
    if status is None:
        raise StoreStatusError(f"{status_path(data_dir)} does not exist: the store has no signature to mark")
    if status.state == DIRTY:
        return status
    # The final signature described the state at the shutdown; from now on the state moves.
    return write_status(data_dir, replace(status, state=DIRTY, shutdown_id=None, position=None))


def mark_clean(
    data_dir: str | os.PathLike, shutdown_id: str, position: tuple[int, int] | None
) -> StoreStatus:
    """The store stopped at the orderly cluster shutdown ``shutdown_id``, at ``position``."""
    status = read_status(data_dir)
    if status is None:
        raise StoreStatusError(f"{status_path(data_dir)} does not exist: the store has no signature to mark")
    return write_status(
        data_dir,
        replace(
            status,
            state=CLEAN,
            shutdown_id=shutdown_id,
            position=tuple(position) if position is not None else None,
        ),
    )
