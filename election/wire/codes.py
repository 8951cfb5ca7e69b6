"""Every error code that crosses the wire, in one place.

A failed reply names one of these stable words in its ``error`` field; clients
and tools match on them, so a word never changes meaning and is never reused.
They are grouped by who sends them; the same word in two groups (``bad_request``,
``internal``) means the same thing everywhere.

Example::

    from election.wire import codes
    if exc.code == codes.E_NOT_LEADER:
        follow(reply["leader"])
"""

from __future__ import annotations

# The envelope (election/wire/): any server, before the request reaches its handler.
E_MALFORMED = "malformed"
E_OVERSIZED = "oversized"
# A request of a protocol version outside the server's range (election.wire.SERVED_VERSIONS); its message
# names the request's version and the range. The word is kept from version 1, which clients already match.
E_VERSION = "wrong_version"
E_UNKNOWN_OP = "unknown_op"
E_BAD_REQUEST = "bad_request"
E_INTERNAL = "internal"

# Bookies (ledger/bookie/server.py).
E_FENCED = "fenced"
E_BAD_ENTRY = "bad_entry"
E_NO_ENTRY = "no_entry"
E_BUSY = "busy"
E_UNKNOWN = "unknown"  # cannot vouch for this ledger (limbo): never counted as "no such entry"
E_READONLY = "readonly"  # the disk is full: adds are refused until a commit succeeds again
E_WRONG_BOOKIE = "wrong_bookie"  # the request names another bookie id (a new bookie on an old address)

# Secure servers (brokers and bookies, election/secure/roles.py): the client's key has no right to this op.
E_FORBIDDEN = "forbidden"

# Broker requests (broker/protocol/, broker/server/request_loop.py).
E_NOT_LEADER = "not_leader"
E_UNAVAILABLE = "unavailable"
E_INVALID_QUEUE = "invalid_queue"
E_PAYLOAD_TOO_LARGE = "payload_too_large"
# The leader wrote (or is writing) a ClusterShutdown: it accepts no more writes (reads go on).
E_SHUTTING_DOWN = "shutting_down"

# State-machine results (broker/state/apply.py), returned in replies as they are.
E_BAD_EVENT = "bad_event"
E_UNKNOWN_EVENT = "unknown_event"
E_NO_SUCH_TASK = "no_such_task"
E_STALE_ATTEMPT = "stale_attempt"
E_NOT_RUNNING = "not_running"
E_NOT_OWNER = "not_owner"
E_BAD_STATE = "bad_state"
E_DUPLICATE_TASK_ID = "duplicate_task_id"
E_STALE_EPOCH = "stale_epoch"
E_DIGEST_MISMATCH = "digest_mismatch"
# Periodic tasks (broker/state/apply_schedules.py): no schedule of that name; one of that name with
# another definition (add it with replace to change it).
E_NO_SUCH_SCHEDULE = "no_such_schedule"
E_SCHEDULE_EXISTS = "schedule_exists"
# A submit to a queue holding its max_waiting tasks, with overflow reject (broker/state/apply_limits.py);
# the message names the queue and the limit.
E_QUEUE_FULL = "queue_full"
# A leader refuses an op whose events need a feature flag the cluster has not enabled; the message
# names the `fencepost cluster enable-feature` command.
E_FEATURE_DISABLED = "feature_disabled"

# Snapshot transfer. Two words on purpose, both matched by clients and tests:
# E_NO_SUCH_SNAPSHOT: the snapshot_chunk names a file this broker does not hold
#   (pruned meanwhile: ask snapshot_info again);
# E_NO_SNAPSHOT: this broker offers no snapshot at all (none taken, or it serves none),
#   sent by the broker and raised by the downloader when snapshot_info says null.
E_NO_SUCH_SNAPSHOT = "no_such_snapshot"
E_NO_SNAPSHOT = "no_snapshot"
E_BAD_REPLY = "bad_reply"  # client side: a snapshot_info reply lacks or garbles fields
E_BAD_CHUNK = "bad_chunk"  # client side: a chunk of the wrong size or checksum

# Client side only: raised by broker.api.client, never sent by a server.
E_CLOSED = "closed"
E_WAIT_TIMEOUT = "wait_timeout"
E_NO_REPLY = "no_reply"  # a one-off request got no reply in time (election/wire/exchange.py)
# A secure client's keys file lists no broker key under the address it was sent to: it never talks there.
E_UNTRUSTED_SERVER = "untrusted_server"
# ZooKeeper holds no root for the cluster named (a typo, or a cluster never initialized there).
E_NO_SUCH_CLUSTER = "no_such_cluster"

# Answered by the HTTP API only (broker/admin/http_api/statuses.py maps each to its status), never on the wire.
E_UNAUTHORIZED = "unauthorized"  # no Authorization header, not a Bearer key, or a key the file does not list
E_RATE_LIMITED = (
    "rate_limited"  # this key sent more requests than --rate-limit allows: retry after Retry-After
)
E_NOT_FOUND = "not_found"  # no such path
E_METHOD_NOT_ALLOWED = "method_not_allowed"  # the path exists, not with this method

# Client side only: `fencepost queue show` names a queue the cluster does not list (broker/api/queue_settings.py).
E_NO_SUCH_QUEUE = "no_such_queue"
