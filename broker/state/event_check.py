"""Decoding a ledger entry with a check per event type compiled from its schema (what replay runs).

:func:`broker.state.events.decode_batch` checks each event with
:func:`~broker.state.events.validate_event`, a loop over the schema's fields that
looks up each field's kind and checker: about 2.4 us of a TaskSubmitted's 3.2 us
of decoding, paid by every replica for every event it replays. :func:`decode_entry`
gives the same result with one function per event type, made once at import from
:data:`broker.state.events.SCHEMAS` (so a field added there is checked here too):
the common kinds (integers in a range, bytes, names, ids, keys, booleans) are
checked inline, the others by the schema's own checker. The events of an entry
come as their leader encoded them, so nearly all of one type share one layout
(their keys, in order): per layout met, a check that unpacks the values by
position and, for the layout leaders write (the schema's order, unset late fields
left out), normalizes the decoded event in place, else builds the copy in one dict
display (at most :data:`LAYOUTS_MAX` layouts per type; others take the type's check).

A compiled check only ever says "this event is valid, here is its normalized
copy" or "not sure"; on "not sure" (a bad value, a missing field, a type with
checks beyond its fields) the event goes through ``validate_event``, which
raises the :class:`~broker.state.events.BadEvent` it always did. So the events
accepted, their normalized copies (same fields, same order, lists copied) and
the errors are those of ``decode_batch``; ``tests/unit/test_event_check.py``
compares them.

Example::

    events = decode_entry(entry.payload)   # == decode_batch(entry.payload)
"""

from __future__ import annotations

from typing import Any, Callable

import msgpack

from broker.state import events as _events
from broker.state.events import BATCH_FORMAT_VERSION, SCHEMAS, decode_batch, validate_event


def _sized(v: str, limit: int) -> str:
    """The test of a string of 1 to ``limit`` UTF-8 bytes."""
    return f"type({v}) is str and (0 < len({v}) <= {limit} if {v}.isascii() else 0 < len({v}.encode()) <= {limit})"


# Event types whose validation checks more than each field alone (validate_event's own rules).
_WHOLE_EVENT_RULES = frozenset({"TasksPurged", "SettingChanged"})
# Kinds checked inline: the source of one test of the value named ``{v}``. An ASCII string's length
# is its UTF-8 length, so only other strings are encoded to be measured.
_INLINE = {
    "bytes": "type({v}) is bytes",
    "bool": "type({v}) is bool",
    "id": _sized("{v}", _events.MAX_ID_BYTES),
    "key": _sized("{v}", _events.MAX_KEY_BYTES),
    "name": _sized("{v}", _events.MAX_NAME_BYTES) + " and '\\0' not in {v}",
}


def _test(kind: str, checker_name: str, v: str = "v") -> str:
    base = kind.rstrip("?")
    if base in _events._INT_RANGES:
        lo, hi = _events._INT_RANGES[base]
        test = f"type({v}) is int and {lo} <= {v} <= {hi}"
    else:
        test = _INLINE[base].format(v=v) if base in _INLINE else f"{checker_name}({v})"
    return f"{v} is None or ({test})" if kind.endswith("?") else test


def _compile(etype: str, schema: dict[str, tuple[str, Any]]) -> Callable[[dict], dict | None]:
    """The check of one event type: its normalized copy, or None if validate_event must decide.

    Strict where validate_event is lenient (a str or bytes subclass, a value whose encoding
    fails): such an event is left to validate_event, never accepted differently.
    """
    fields = frozenset(schema) | {"type"}
    env: dict[str, Any] = {"_fields": fields, "_missing": _MISSING}
    lines = [
        "def check(ev):",
        "    try:",
        "        if not ev.keys() <= _fields:",
        "            return None",
        f"        out = {{'type': {etype!r}}}",
    ]
    for i, (name, (kind, default)) in enumerate(schema.items()):
        checker = f"_check{i}"
        env[checker] = _events._checker(kind)
        lines.append(f"        v = ev.get({name!r}, _missing)")
        if default is _events._REQUIRED:
            lines += ["        if v is _missing:", "            return None"]
        else:
            env[f"_default{i}"] = default
            lines += ["        if v is _missing:", f"            v = _default{i}"]
            # A default is taken as it is, unchecked, as validate_event takes it.
            lines += ["        elif not (" + _test(kind, checker) + "):", "            return None"]
        if default is _events._REQUIRED:
            lines += ["        if not (" + _test(kind, checker) + "):", "            return None"]
        base = kind.rstrip("?")
        if base not in _events._INT_RANGES and base not in _INLINE:  # may be a list: copied
            lines.append("        v = list(v) if isinstance(v, list) else v")
        lines.append(f"        out[{name!r}] = v")
    lines += ["        return out", "    except Exception:", "        return None"]
    exec("\n".join(lines), env)  # noqa: S102 - source made above from the schema alone
    return env["check"]


_MISSING = object()

CHECKS: dict[str, Callable[[dict], dict | None]] = {
    etype: _compile(etype, schema) for etype, schema in SCHEMAS.items() if etype not in _WHOLE_EVENT_RULES
}

# Per event type, the checks of the key layouts met so far (the keys of a decoded event, in their
# order): an entry's events come as their leader encoded them, nearly always in one or two layouts.
_LAYOUTS: dict[str, dict[tuple, Callable[[dict], dict | None]]] = {etype: {} for etype in CHECKS}
LAYOUTS_MAX = 64  # layouts compiled per type; past it, events take the type's check


def _compile_layout(etype: str, keys: tuple) -> Callable[[dict], dict | None] | None:
    """The check of events of ``etype`` with exactly ``keys`` in that order, or None if no event
    with those keys can be valid (an unknown or missing field: the type's check decides).

    The values are unpacked by position instead of looked up by name. An event laid out in the
    schema's order, the fields it lacks all last (as leaders write them), is normalized in place:
    its lists copied, the defaults of the absent fields appended, so that its fields end in the
    schema's order without a copy of the event built; the caller owns it (decoded for it). Any other
    layout gets a normalized copy, one dict display in the schema's order.
    """
    schema = SCHEMAS[etype]
    if "type" not in keys or not set(keys) <= set(schema) | {"type"}:
        return None
    if any(default is _events._REQUIRED and name not in keys for name, (_, default) in schema.items()):
        return None
    env: dict[str, Any] = {}
    var = {name: f"v{i}" for i, name in enumerate(keys)}
    tests, values = [], {"type": repr(etype)}  # values: each field's normalized value, as source
    for i, (name, (kind, default)) in enumerate(schema.items()):
        if name not in keys:
            env[f"_default{i}"] = default  # taken as it is, unchecked, as validate_event takes it
            values[name] = f"_default{i}"
            continue
        env[f"_check{i}"] = _events._checker(kind)
        tests.append("(" + _test(kind, f"_check{i}", var[name]) + ")")
        base = kind.rstrip("?")
        copied = base not in _events._INT_RANGES and base not in _INLINE  # may be a list: copied
        v = var[name]
        values[name] = f"list({v}) if isinstance({v}, list) else {v}" if copied else v
    if keys == tuple(values)[: len(keys)]:  # schema order, absent fields last: in place
        changed = [
            (name, value) for name, value in values.items() if name != "type" and value != var.get(name)
        ]
        result = [f"ev[{name!r}] = {value}" for name, value in changed]
        result += ["return ev"]
    else:
        result = ["return {" + ", ".join(f"{name!r}: {value}" for name, value in values.items()) + "}"]
    lines = [
        "def check(ev):",
        "    try:",
        f"        {', '.join(var.values())}, = ev.values()",
        f"        if not ({' and '.join(tests) or 'True'}):",
        "            return None",
        *(f"        {line}" for line in result),
        "    except Exception:",
        "        return None",
    ]
    exec("\n".join(lines), env)  # noqa: S102 - source made above from the schema alone
    return env["check"]


def _layout_check(etype: str, keys: tuple) -> Callable[[dict], dict | None]:
    """The check of ``etype``'s events laid out as ``keys``: compiled, else the type's check."""
    layouts = _LAYOUTS[etype]
    check = _compile_layout(etype, keys) or CHECKS[etype]
    if len(layouts) < LAYOUTS_MAX:
        layouts[keys] = check
    return check


def check_event(ev: Any) -> dict:
    """:func:`~broker.state.events.validate_event` of one event, by its compiled check (``ev``
    itself is left as it is)."""
    return _checked(dict(ev) if type(ev) is dict else ev)


def _checked(ev: Any) -> dict:
    """:func:`check_event` of an event the caller owns, which may be normalized in place."""
    if type(ev) is dict:
        etype = ev.get("type")
        layouts = _LAYOUTS.get(etype) if type(etype) is str else None
        if layouts is not None:
            keys = tuple(ev)
            check = layouts.get(keys) or _layout_check(etype, keys)
            out = check(ev)
            if out is not None:
                return out
    return validate_event(ev)


def decode_entry(data: bytes) -> list[dict]:
    """:func:`~broker.state.events.decode_batch`, checking each event by its compiled check.

    Anything but a well-formed batch map goes to ``decode_batch`` itself, which raises
    the :class:`~broker.state.events.BadEvent` it always did.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return decode_batch(data)
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception:
        return decode_batch(data)
    if type(doc) is not dict or len(doc) != 2 or "v" not in doc or type(doc.get("events")) is not list:
        return decode_batch(data)
    if doc["v"] != BATCH_FORMAT_VERSION:
        return decode_batch(data)
    return [_checked(ev) for ev in doc["events"]]  # decoded here: normalized in place
