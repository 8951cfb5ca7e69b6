"""Protocol versions on the wire: a server serves a range, names both ends when it refuses, keeps serving."""

import pytest

from election import wire
from election.wire import codes
from election.wire.dispatch import Dispatcher

pytestmark = pytest.mark.timeout(30)


def _frame(version):
    return wire.encode({"v": version, "op": "ping", "rid": 5})


def test_the_served_range_holds_this_version_and_the_base():
    assert wire.PROTOCOL_VERSION in wire.SERVED_VERSIONS
    assert wire.SERVED_VERSIONS.low >= wire.BASE_PROTOCOL_VERSION
    assert wire.SERVED_VERSIONS.low >= wire.PROTOCOL_VERSION - 1  # one version back, no further promise
    # A client of the previous version (or of the base, while this is the base) is served.
    previous = max(wire.BASE_PROTOCOL_VERSION, wire.PROTOCOL_VERSION - 1)
    assert wire.decode_request(_frame(previous), {"ping"})["v"] == previous


@pytest.mark.parametrize("version", [1, 2])
def test_a_wider_range_serves_each_of_its_versions(version):
    assert wire.decode_request(_frame(version), {"ping"}, versions=wire.VersionRange(1, 2))["rid"] == 5


@pytest.mark.parametrize("version", [0, 3, -1, True, "2", None, 2**40])
def test_a_version_outside_the_range_is_refused_naming_it_and_the_range(version):
    with pytest.raises(wire.WireError) as info:
        wire.decode_request(_frame(version), {"ping"}, versions=wire.VersionRange(1, 2))
    assert info.value.code == codes.E_VERSION == "wrong_version" and info.value.rid == 5
    assert repr(version) in info.value.message and "versions 1 to 2" in info.value.message


def test_a_reply_of_a_newer_version_is_read_by_a_client():
    # An upgraded server answers with its own version: this client reads the fields it knows.
    reply = wire.decode(wire.encode({"v": wire.PROTOCOL_VERSION + 1, "rid": 3, "ok": True, "x": 1}))
    assert wire.check_reply(reply)["x"] == 1
    with pytest.raises(wire.WireError):
        wire.decode(wire.encode({"v": 0, "rid": 3, "ok": True}))


def test_a_server_answers_a_wrong_version_counts_it_and_serves_the_next_request():
    dispatcher = Dispatcher("broker", {"ping": lambda msg, ctx: wire.ok_reply(ctx.rid)}, 1 << 20)
    refused = dispatcher.handle([b"peer"], _frame(wire.PROTOCOL_VERSION + 1), None, 0.0).reply
    assert refused["error"] == codes.E_VERSION and refused["rid"] == 5
    assert f"version {wire.PROTOCOL_VERSION + 1}" in refused["message"]
    assert wire.SERVED_VERSIONS.text() in refused["message"]
    assert dispatcher.counters["bad_requests"] == 1
    assert dispatcher.handle([b"peer"], _frame(wire.PROTOCOL_VERSION), None, 0.0).reply["ok"]
