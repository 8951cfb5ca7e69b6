"""Where a broker keeps each shard's store, for the commands that work on data dirs (``store``, ``snapshot``).

A broker of a cluster of several shards keeps shard 0 in its data dir and shard ``n > 0`` in
``<data>/shards/<n>`` (:mod:`broker.server.shard_command`), each with its own ``state/``,
``snapshots/`` and ``store.status``. The broker id of every shard is the one in
``<data>/.broker.meta``: a shard's dir has none of its own. A command given a broker data dir
finds its shards' dirs here; given a shard's dir, it learns the shard from the path.

Example::

    shard_dirs(Path("b1"))                 # {0: b1, 1: b1/shards/1, 2: b1/shards/2}
    shard_of_dir(Path("b1/shards/2"))      # 2
    broker_data_dir(Path("b1/shards/2"))   # b1 (its .broker.meta names the broker)
    store_dir(Path("b1"), 2)               # b1/shards/2
"""

from __future__ import annotations

from pathlib import Path

from broker import BrokerError
from broker.server.shard_command import SHARDS_DIR, shard_data_dir
from election.identity import META
from election.shards import MAX_SHARDS


def shard_of_dir(path: Path) -> int:
    """The shard whose dir ``path`` is: ``n`` for ``<data>/shards/<n>``, else 0 (a broker's own data dir)."""
    path = Path(path)
    if path.parent.name == SHARDS_DIR and path.name.isdigit() and 0 < int(path.name) < MAX_SHARDS:
        return int(path.name)
    return 0


def broker_data_dir(path: Path) -> Path:
    """The broker data dir holding ``path`` (``path`` itself unless it is a shard's dir)."""
    path = Path(path)
    return path.parent.parent if shard_of_dir(path) else path


def shard_dirs(data: Path) -> dict[int, Path]:
    """``{shard: dir}`` of a broker data dir: 0 is ``data``, then each ``shards/<n>`` there, by shard."""
    data = Path(data)
    found = {0: data}
    shards = data / SHARDS_DIR
    if shards.is_dir():
        for child in shards.iterdir():
            if child.is_dir() and shard_of_dir(child):
                found[int(child.name)] = child
    return dict(sorted(found.items()))


def is_sharded(path: Path) -> bool:
    """Whether ``path`` is a shard's dir or a broker data dir holding shards' dirs."""
    return bool(shard_of_dir(path)) or len(shard_dirs(path)) > 1


def store_dir(data: Path, shard: int | None) -> Path:
    """The dir of ``shard``'s store in broker data dir ``data`` (``data`` itself for None or 0).

    ``data`` may be a shard's dir already: then ``shard`` must be None or name that shard.
    """
    data = Path(data)
    own = shard_of_dir(data)
    if own:
        if shard not in (None, own):
            raise BrokerError(f"{data} is the dir of shard {own}, not of shard {shard}")
        return data
    return shard_data_dir(data, shard) if shard else data


def meta_path(path: Path) -> Path:
    """The ``.broker.meta`` that names the broker of the store in ``path`` (the parent's for a shard)."""
    return broker_data_dir(path) / META
