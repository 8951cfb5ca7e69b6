"""Bounds of a read over a cluster's shards: which shards, and a position per shard to start or stop at.

Each shard has its own log (docs/architecture.md, "One process per shard"), so a position
``LEDGER:ENTRY`` is a place in one shard's history. The source's ``from`` and ``to``
options hold a position per shard, ``SHARD=LEDGER:ENTRY`` separated by commas (a shard
not named is unbounded); a plain ``LEDGER:ENTRY`` bounds the one shard read (a 1-shard
cluster, or a read whose ``shards`` option names one shard) and is refused on a read of
several: which shard it meant would be a guess. ``shards`` names the shards read
(``0,2``; default: every shard of the cluster).

Pure: parsing and checking only, unit-tested without a cluster.

Example::

    bounds = parse_bounds("0=7:41,2=9:0")
    bounds.for_shards([0, 1, 2], "from")        # {0: (7, 41), 1: None, 2: (9, 0)}
    parse_bounds("7:41").for_shards([0], "from")  # {0: (7, 41)}
    format_bounds({0: (7, 41), 2: (9, 0)})      # "0=7:41,2=9:0"
    shards_read("0,2", cluster_shards=3)        # [0, 2]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from election.shards import MAX_SHARDS
from pipeline import PipelineError
from pipeline.rows import Position, format_position, parse_position


@dataclass(frozen=True)
class ShardBounds:
    """A ``from`` or ``to`` option: one plain position, or a position per shard (empty: unbounded).

    Example::

        ShardBounds(by_shard={1: (9, 3)}).for_shards([0, 1], "to")     # {0: None, 1: (9, 3)}
    """

    plain: Position | None = None
    by_shard: Mapping[int, Position] = field(default_factory=dict)

    def for_shards(self, shards: list[int], name: str) -> dict[int, Position | None]:
        """The bound of each shard read; :class:`PipelineError` if the option cannot be meant for them."""
        if self.plain is not None:
            if len(shards) != 1:
                raise PipelineError(
                    f"{name}: a read of {len(shards)} shards needs a position per shard, "
                    f"SHARD=LEDGER:ENTRY[,...] (like 0={format_position(self.plain)}), not a plain position"
                )
            return {shards[0]: self.plain}
        strangers = sorted(set(self.by_shard) - set(shards))
        if strangers:
            raise PipelineError(
                f"{name}: shard {', '.join(map(str, strangers))} is not read "
                f"(shards read: {', '.join(map(str, shards))})"
            )
        return {shard: self.by_shard.get(shard) for shard in shards}


def _shard_number(text: str, what: str) -> int:
    try:
        shard = int(text.strip())
    except ValueError:
        raise PipelineError(f"{what}: a shard is a number, not {text.strip()!r}") from None
    if not 0 <= shard < MAX_SHARDS:
        raise PipelineError(f"{what}: a shard is 0-{MAX_SHARDS - 1}, not {shard}")
    return shard


def parse_bounds(text: str | None) -> ShardBounds:
    """The option's value (``LEDGER:ENTRY`` or ``SHARD=LEDGER:ENTRY,...``; None or empty: unbounded)."""
    if text is None or not str(text).strip():
        return ShardBounds()
    text = str(text)
    if "=" not in text:
        return ShardBounds(plain=parse_position(text))
    by_shard: dict[int, Position] = {}
    for item in text.split(","):
        shard_text, _, position = item.partition("=")
        shard = _shard_number(shard_text, f"the position {item.strip()!r}")
        if shard in by_shard:
            raise PipelineError(f"shard {shard} has two positions in {text!r}")
        by_shard[shard] = parse_position(position)
    return ShardBounds(by_shard=by_shard)


def format_bounds(positions: Mapping[int, Position | None]) -> str:
    """Per-shard positions as an option's value, in shard order (shards without one are left out)."""
    return ",".join(
        f"{shard}={format_position(position)}"
        for shard, position in sorted(positions.items())
        if position is not None
    )


def shards_read(text: str | None, cluster_shards: int) -> list[int]:
    """The shards a ``shards`` option names (None or empty: every shard of the cluster), in order."""
    if text is None or not str(text).strip():
        return list(range(cluster_shards))
    chosen = sorted({_shard_number(item, "shards") for item in str(text).split(",")})
    beyond = [s for s in chosen if s >= cluster_shards]
    if beyond:
        raise PipelineError(
            f"shards: the cluster has {cluster_shards} shard(s) (0-{cluster_shards - 1}), not shard {beyond[0]}"
        )
    return chosen
