"""What the wire fuzzer may send to each kind of server: its ops, valid requests, and what is off limits.

A :class:`Target` names a server kind (``broker`` or ``bookie``), takes its ops
from the protocol module's own ``OPS`` (so a new op is fuzzed without a change
here), and gives for each op a builder of one valid request's fields. An op
with no builder yet is fuzzed with fields drawn from every field name the
target knows. :meth:`Target.harmless` is the safety filter every fuzzed frame
passes before it is sent: it decodes the frame exactly as the server will and
refuses the few requests that would change the cluster under test instead of
testing the wire (a ``cluster_shutdown``, an add or fence on a ledger the
cluster writes, a long poll that would hold its reply for seconds).

Bookie requests name ledgers from :data:`FUZZ_LEDGER_BASE` up: ledger ids are
ZooKeeper sequence numbers (below 2^31), so the fuzzer never touches the
cluster's own ledgers.

Example::

    rng = random.Random(3)
    fields = BOOKIE.templates["add"](rng)
    frame = wire.encode(wire.request("add", 1, **fields))
    assert BOOKIE.harmless(frame)
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

import msgpack

from broker import protocol as broker_protocol
from devtools.fuzz import QUEUES
from devtools.fuzz import TEMPLATES as BROKER_TEMPLATES
from ledger.bookie import protocol as bookie_protocol
from ledger.codec import Digest, Entry, encode_entry

FUZZ_LEDGER_BASE = 1 << 40
FUZZ_LEDGERS = 256
# A fuzzed long poll may wait this long at most, so a parked reply is not taken for a missing one.
MAX_HOLD_MS = 200
_DIGEST = Digest.crc32c()

Template = Callable[[random.Random], dict]


@dataclass(frozen=True)
class Target:
    """One server kind as the fuzzer sees it."""

    name: str
    ops: tuple[str, ...]
    templates: dict[str, Template]
    field_names: tuple[str, ...]
    refuse: Callable[[dict], bool]

    def fields(self, op: str, rng: random.Random) -> dict:
        """A valid request's fields for ``op``, or a few known fields for an op without a builder."""
        template = self.templates.get(op)
        if template is not None:
            return template(rng)
        return {name: None for name in rng.sample(self.field_names, rng.randrange(0, 4))}

    def harmless(self, frame: bytes) -> bool:
        """False if the server would decode ``frame`` into a request the fuzzer must not send."""
        try:
            msg = msgpack.unpackb(frame, raw=False, strict_map_key=False)
        except Exception:  # the server cannot decode it either: it can only refuse it
            return True
        # The server refuses a request whose op is not a string before it reads any field.
        return not (isinstance(msg, dict) and isinstance(msg.get("op"), str) and self.refuse(msg))


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _long_hold(msg: dict, name: str) -> bool:
    return _int(msg.get(name)) and msg[name] > MAX_HOLD_MS


# -- broker -----------------------------------------------------------------------

# Ops that would change the cluster rather than test a request: the last entry of its life.
BROKER_UNSAFE = frozenset({"cluster_shutdown"})


def _refuse_broker(msg: dict) -> bool:
    return msg.get("op") in BROKER_UNSAFE or (msg.get("op") == "lease" and _long_hold(msg, "wait_ms"))


def _declare(rng: random.Random) -> dict:
    fields = {"queue": rng.choice(QUEUES)}
    for name, value in (
        ("max_attempts", rng.randrange(1, 5)),
        ("lease_ms", rng.choice([100, 30_000])),
        ("retry_backoff_ms", rng.randrange(0, 100)),
        ("result_ttl_ms", rng.choice([0, 60_000])),
    ):
        if rng.random() < 0.5:
            fields[name] = value
    return fields


_BROKER_TEMPLATES: dict[str, Template] = {**BROKER_TEMPLATES, "declare_queue": _declare}
BROKER = Target(
    name="broker",
    ops=tuple(sorted(broker_protocol.OPS - BROKER_UNSAFE)),
    templates={op: t for op, t in _BROKER_TEMPLATES.items() if op in broker_protocol.OPS},
    field_names=tuple(
        sorted(
            {
                "each",
                "reject",
                "result_ttl_ms",
                "shutdown_id",
                "max_run_ms",
                "retry_backoff_ms",
                "retry_backoff_max_ms",
                *(k for t in BROKER_TEMPLATES.values() for k in t(random.Random(0))),
            }
        )
    ),
    refuse=_refuse_broker,
)

# -- bookie -----------------------------------------------------------------------


def fuzz_ledger(rng: random.Random) -> int:
    return FUZZ_LEDGER_BASE + rng.randrange(FUZZ_LEDGERS)


def entry_bytes(ledger: int, entry: int, lac: int = -1, payload: bytes = b"fz") -> bytes:
    """A well-formed entry of ``ledger``/``entry``, as a writer sends it."""
    return encode_entry(Entry(ledger, entry, lac, 1, payload), _DIGEST)


def _add(rng: random.Random) -> dict:
    ledger, entry = fuzz_ledger(rng), rng.randrange(8)
    fields = {
        "ledger": ledger,
        "entry": entry,
        "data": entry_bytes(ledger, entry, entry - 1, b"p" * rng.randrange(32)),
    }
    if rng.random() < 0.3:
        fields["recovery"] = rng.random() < 0.5
    return fields


def _add_batch(rng: random.Random) -> dict:
    ledger, first = fuzz_ledger(rng), rng.randrange(8)
    count = rng.randrange(1, 5)
    return {
        "ledger": ledger,
        "first": first,
        "entries": [entry_bytes(ledger, first + i, first + i - 1) for i in range(count)],
    }


_BOOKIE_TEMPLATES: dict[str, Template] = {
    "ping": lambda rng: {},
    "stats": lambda rng: {},
    "add": _add,
    "add_batch": _add_batch,
    "read": lambda rng: {"ledger": fuzz_ledger(rng), "entry": rng.randrange(8)},
    "read_lac": lambda rng: {"ledger": fuzz_ledger(rng)},
    "wait_lac": lambda rng: {
        "ledger": fuzz_ledger(rng),
        "after": rng.randrange(-1, 8),
        "timeout_ms": rng.choice([0, 0, 5, 20]),
        "max_entries": rng.randrange(0, 4),
    },
    "write_lac": lambda rng: {"ledger": fuzz_ledger(rng), "lac": rng.randrange(8)},
    "fence": lambda rng: {"ledger": fuzz_ledger(rng)},
    "delete": lambda rng: {"ledger": fuzz_ledger(rng)},
}
# Ops that only read: safe on any ledger, the cluster's own included.
BOOKIE_READS = frozenset({"ping", "stats", "read", "read_lac"})


def _refuse_bookie(msg: dict) -> bool:
    if msg.get("op") == "wait_lac" and _long_hold(msg, "timeout_ms"):
        return True
    if msg.get("op") in BOOKIE_READS:
        return False
    ledger = msg.get("ledger")
    return _int(ledger) and 0 <= ledger < FUZZ_LEDGER_BASE


BOOKIE = Target(
    name="bookie",
    ops=tuple(sorted(bookie_protocol.OPS)),
    templates={op: t for op, t in _BOOKIE_TEMPLATES.items() if op in bookie_protocol.OPS},
    field_names=(
        "ledger",
        "entry",
        "data",
        "recovery",
        "first",
        "entries",
        "after",
        "timeout_ms",
        "max_entries",
        "lac",
        "bookie",
    ),
    refuse=_refuse_bookie,
)
TARGETS = {"broker": BROKER, "bookie": BOOKIE}
