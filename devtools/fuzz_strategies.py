"""Hypothesis strategies for hostile request messages, over the envelope and every op's fields.

:func:`message` draws ZeroMQ messages (lists of parts) for a target
(:mod:`devtools.fuzz_targets`): a request of one of its ops (or of an unknown
op) whose envelope may carry a wrong protocol version, a request id of any
type, a missing or ill-typed op, unknown extra fields; whose fields start as a
valid request and are then replaced by values of the wrong type, huge or
negative numbers, deep nesting, strings that are not UTF-8, maps with
non-string keys, or dropped; and now and then the whole frame is not a map,
or the message has extra leading parts. :func:`hypothesis_messages` runs the
strategy ``count`` times with a fixed seed, without a test around it, so the
messages can be sent pipelined rather than one round trip per example.

Example::

    msgs = hypothesis_messages(BROKER, 500, seed=1)
    assert len(msgs) <= 500
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from devtools.fuzz_mutate import Raw, deep, pack, str_header
from devtools.fuzz_targets import Target
from election.wire import PROTOCOL_VERSION

INT64 = st.integers(-(1 << 63), (1 << 64) - 1)
EDGE_INTS = st.sampled_from(
    [
        0,
        -1,
        1,
        99,
        100,
        1000,
        1001,
        60_000,
        60_001,
        (1 << 31) - 1,
        1 << 31,
        1 << 32,
        (1 << 53) + 1,
        (1 << 63) - 1,
        1 << 63,
        (1 << 64) - 1,
        -(1 << 63),
    ]
)
BAD_UTF8 = st.sampled_from(
    [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"a\x80b", b"\xf8\x88\x80\x80\x80", b"\xe2\x82"]
)
RAW_STRINGS = st.one_of(BAD_UTF8, st.binary(max_size=20)).map(lambda data: Raw(str_header(len(data)) + data))
TEXT = st.one_of(
    st.text(max_size=20), st.sampled_from(["", "\0", "é" * 101, "a" * 129, "😀" * 51, "fz", "../x"])
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.floats(), INT64, EDGE_INTS, TEXT, st.binary(max_size=40), RAW_STRINGS
)
# Map keys that are not strings: ints, bytes, floats, nil, bools (and strings that are not UTF-8).
ODD_KEYS = st.one_of(
    st.none(), st.booleans(), INT64, st.floats(allow_nan=False), st.binary(max_size=8), RAW_STRINGS
)
DEEP = st.builds(deep, st.sampled_from([10, 100, 500, 1000, 1020, 5000]), st.booleans())
HOSTILE = st.one_of(
    SCALARS,
    DEEP,
    st.dictionaries(ODD_KEYS, SCALARS, max_size=3),
    st.recursive(
        SCALARS,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.one_of(TEXT, ODD_KEYS), inner, max_size=4)
        ),
        max_leaves=12,
    ),
)
VERSIONS = st.one_of(
    st.just(PROTOCOL_VERSION),
    st.just(PROTOCOL_VERSION),
    st.just(PROTOCOL_VERSION),
    st.sampled_from([0, 2, -1, "1", 1.0, True, None, [1], (1 << 64) - 1]),
    HOSTILE,
)
RIDS = st.one_of(
    st.integers(0, (1 << 31) - 1),
    INT64,
    TEXT,
    RAW_STRINGS,
    st.none(),
    st.floats(),
    st.booleans(),
    st.binary(max_size=8),
    st.lists(SCALARS, max_size=3),
    st.dictionaries(ODD_KEYS, SCALARS, max_size=2),
)
_WRONG_OPS = st.sampled_from(["", "nope", "PING", "ping ", "é" * 300])
_ENVELOPE_KEEP = st.integers(0, 19)  # 0: leave the envelope field out
_ACTIONS = st.lists(st.tuples(st.integers(0, 7), st.integers(0, 3), HOSTILE), max_size=3)
_EXTRA = st.lists(st.tuples(st.one_of(TEXT, ODD_KEYS), HOSTILE), max_size=2)
_SHAPE = st.integers(0, 9)  # 0: the frame is not a map at all
_PARTS = st.one_of(st.just([]), st.lists(st.binary(max_size=40), min_size=1, max_size=3))


def _strategies(target: Target) -> tuple[st.SearchStrategy, st.SearchStrategy]:
    """The op and extra-field-name strategies of ``target``, built once: building one per draw is slow."""
    cached = _CACHE.get(target.name)
    if cached is None:
        cached = _CACHE[target.name] = (
            st.one_of(
                st.sampled_from(target.ops),
                st.sampled_from(target.ops),
                st.sampled_from(target.ops),
                _WRONG_OPS,
                HOSTILE,
            ),
            st.lists(st.one_of(st.sampled_from(target.field_names), TEXT), max_size=2),
        )
    return cached


_CACHE: dict[str, tuple[st.SearchStrategy, st.SearchStrategy]] = {}


@st.composite
def request_map(draw: st.DrawFn, target: Target) -> Any:
    """One request (map or not), hostile in its envelope, its fields, or both."""
    ops, extra_names = _strategies(target)
    op = draw(ops)
    valid = isinstance(op, str) and op in target.ops
    fields = target.fields(op, draw(st.randoms(use_true_random=False))) if valid else {}
    names = sorted(fields)
    for which, action, value in draw(_ACTIONS):
        if not names:
            break
        name = names[which % len(names)]
        if action == 0:
            fields.pop(name, None)
        else:
            fields[name] = value
    for name in draw(extra_names):
        fields[name] = draw(HOSTILE)
    msg: dict[Any, Any] = {}
    for key, value in (("v", draw(VERSIONS)), ("op", op), ("rid", draw(RIDS))):
        if draw(_ENVELOPE_KEEP):
            msg[key] = value
    msg.update(fields)
    msg.update(draw(_EXTRA))
    return msg if draw(_SHAPE) else draw(HOSTILE)


@st.composite
def message(draw: st.DrawFn, target: Target) -> list[bytes]:
    """One ZeroMQ message: mostly a single frame; sometimes extra leading parts."""
    try:
        body = pack(draw(request_map(target)))
    except (
        TypeError,
        ValueError,
        OverflowError,
        UnicodeEncodeError,
    ):  # lone surrogates: no peer can send them
        body = b"\xc1"
    extra = draw(_PARTS) if draw(_SHAPE) == 0 else []
    return [*extra, body]


def hypothesis_messages(target: Target, count: int, seed: int = 0) -> list[list[bytes]]:
    """Up to ``count`` messages from :func:`message` with a fixed seed, those the target's filter lets through."""
    out: list[list[bytes]] = []

    @hypothesis_seed(seed)
    @settings(
        max_examples=count,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(message(target))
    def collect(msg: list[bytes]) -> None:
        if target.harmless(msg[-1]):
            out.append(msg)

    collect()
    return out
