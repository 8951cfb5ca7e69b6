"""What each role may ask of a secure cluster's servers (pure: no sockets, no keys).

A request's role is the one its client's key has in the keys file (the server
learns it from the ZAP handler, :mod:`election.secure.curve`). A request outside its
role's rights is answered ``forbidden`` and counted; nothing else happens.

- ``producer``: submit tasks, read them, wait for them, cancel them;
- ``worker``: lease, heartbeat, complete, fail;
- ``admin``: everything, on brokers (purge, requeue, retry, shutdown...) and bookies;
- ``broker``: a broker's requests to bookies, another broker's snapshot
  download (a new member catching up) and a follower's heartbeat to the leader;
- ``bookie``: none of a broker's ops (the role identifies bookies to brokers).

Every role may ``ping`` and ask for ``status`` (no task data in it), so tools
and health checks work with any key.

Example::

    allowed("worker", "broker", "complete")      # True
    allowed("worker", "broker", "purge_queue")   # False
    allowed("broker", "bookie", "add")           # True
"""

from __future__ import annotations

ANYONE = frozenset({"ping", "status"})

BROKER_OPS_BY_ROLE: dict[str, frozenset[str]] = {
    "producer": frozenset({"submit", "submit_many", "get", "cancel", "declare_queue"}),
    "worker": frozenset({"lease", "heartbeat", "heartbeat_many", "complete", "complete_many", "fail", "get"}),
    "broker": frozenset({"snapshot_info", "snapshot_chunk", "follower_ping"}),
    "bookie": frozenset(),
}

BOOKIE_OPS_BY_ROLE: dict[str, frozenset[str]] = {
    # Brokers write, fence, recover, read and delete ledgers; the pipeline, audits and `bookie decommission`
    # run with an admin key.
    "broker": frozenset(
        {"add", "add_batch", "read", "read_lac", "wait_lac", "write_lac", "fence", "delete", "stats"}
    ),
    # Re-replication runs in bookies (AutoRecovery): it reads from and adds to other bookies.
    "bookie": frozenset({"add", "add_batch", "read", "read_lac", "stats"}),
}

SERVERS = ("broker", "bookie")


def allowed(role: str, server: str, op: str) -> bool:
    """Whether a client with ``role`` may send ``op`` to a ``server`` (``"broker"`` or ``"bookie"``)."""
    if server not in SERVERS:
        raise ValueError(f"unknown server kind {server!r}")
    if op in ANYONE or role == "admin":
        return True
    if server == "broker":
        return op in BROKER_OPS_BY_ROLE.get(role, frozenset())
    return op in BOOKIE_OPS_BY_ROLE.get(role, frozenset())
