"""How many entries a follower's next read asks for: many while it is behind, one once caught up.

A follower applies what one read of the log returns in one store transaction
(:func:`broker.server.store.follower.apply_entries`), so the size of its reads is
the size of its transactions. Behind (a read came back full: more is committed
than it asked for), bigger reads mean fewer bookie round trips and fewer commits
per entry, so the size grows by :data:`GROWTH` per read up to the tail's limit.
Caught up (a read came back short: it reached the last committed entry), the
next read asks for one entry, so that an entry committed alone is applied alone
and at once, never held back for a batch. The rule is a pure function of the
last read, :func:`next_read_size`.

Example::

    size = FIRST_READ
    while running:
        entries = reader.poll(size, timeout=0.1)
        apply_entries(store, entries)                     # one transaction
        size = next_read_size(size, len(entries), limit=500)
"""

from __future__ import annotations

# A tail's first read after it starts: usually behind by the entries committed while it was down.
FIRST_READ = 64
GROWTH = 4


def next_read_size(asked: int, got: int, limit: int) -> int:
    """The size of the next read after one that asked for ``asked`` entries and got ``got``.

    Full (``got >= asked``): behind, grow up to ``limit``. Short: caught up, one entry.
    """
    if got >= asked:
        return min(limit, asked * GROWTH)
    return 1
