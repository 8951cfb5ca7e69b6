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

import os
import re
from dataclasses import dataclass
from typing import ClassVar

from election.local.member_config import THIRTY_DAYS_S, MemberConfig, member_field, parse_listen, setting
from ledger import LedgerError
from ledger.bookie.store import DEFAULT_MAP_SIZE

_BOOKIE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass
class BookieConfig(MemberConfig):
    """Every option of a bookie: the shared ones of :class:`MemberConfig`, and its own.

    See docs/configuration for the reference. The ``metadata`` of each field is its
    command-line option's help and range (``bookie start``'s options are generated from
    these fields).

    A bookie has no ``secret_file``: it never verifies an ``hmac-sha256`` digest (it
    checks an entry's framing, and a CRC32C digest after a crash, and stores the bytes;
    the readers verify), so it needs no cluster secret. It still compares the shared
    options it is given (``digest`` included) with the cluster's.
    """

    config_error: ClassVar[type[Exception]] = LedgerError

    data: str = member_field("data", "./bookie-data")
    listen: str = member_field("listen", "tcp://127.0.0.1:3181")
    map_size_bytes: int = member_field(
        "map_size_bytes", DEFAULT_MAP_SIZE, default_text=f"{DEFAULT_MAP_SIZE >> 30} GiB"
    )
    bookie_id: str | None = setting(None, "Stable bookie id.", default_text="kept in the data dir's cookie")
    max_batch: int = setting(
        1000, "Frames drained per poll turn: the most adds in one group commit.", min=1, max=1_000_000
    )
    long_poll_max_ms: int = setting(30000, "Cap on a wait_lac long poll.", unit="ms", min=0, max=3_600_000)
    gc_interval_s: float = setting(
        60.0,
        "Seconds between garbage-collection passes, which delete the local copies of ledgers whose "
        "metadata no longer names this bookie (one pass also runs at start, before serving).",
        unit="s",
        min=0,
        min_open=True,
        max=THIRTY_DAYS_S,
    )
    journal_dir: str = setting(
        "",
        "Journal directory: every add and fence is fsynced here before it is acknowledged, so a "
        "disk of its own speeds up adds. It belongs to this data directory's store (a journal of "
        "another bookie is refused).",
        default_text="<data>/journal",
        path="dir",
    )
    journal_file_bytes: int = setting(
        64 * 1024 * 1024,
        "Size each journal file is preallocated to; a full one rolls to the next and brings a checkpoint.",
        unit="bytes",
        default_text="64 MiB",
        min=1 << 16,
        max=1 << 34,
    )
    journal_checkpoint_s: float = setting(
        5.0,
        "Seconds between checkpoints: the entry store is synced and the journal files before it "
        "are deleted; at most this much journal is replayed after a crash (a filled file also checkpoints).",
        unit="s",
        min=0,
        min_open=True,
        max=3600,
    )

    def journal_path(self) -> str:
        """The journal directory: ``journal_dir``, or ``<data>/journal``."""
        return self.journal_dir or os.path.join(self.data, "journal")

    def validate(self) -> "BookieConfig":
        """Check every option; raise LedgerError naming the first bad one."""
        super().validate()
        if self.bookie_id is not None and not _BOOKIE_ID.match(self.bookie_id):
            raise LedgerError(
                "bookie_id must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit, "
                f"got {self.bookie_id!r}"
            )
        return self

    def default_bookie_id(self) -> str:
        """``bookie-<host>-<port>`` from ``listen``: the id used when none is configured.

        It only names a fresh data directory: the id is then kept in the cookie,
        so moving the bookie to another port does not change its identity.
        """
        host, port = parse_listen(self.listen, LedgerError)
        host = host.strip("[]")
        return "bookie-" + "".join(c if c.isalnum() or c in "-." else "_" for c in host) + f"-{port}"
