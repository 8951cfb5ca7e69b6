"""The pure parts of starting a cluster without a log: what a member reports, and reading a store."""

from broker.server.store.cluster_start import describe_store, member_doc, member_of
from broker.state.store import StateStore
from election.cluster_join import MemberStore
from election.local.store_status import StoreStatus, ensure_status, mark_clean, read_status


def test_a_member_report_survives_its_json_form():
    status = StoreStatus("c1", 12.5, "clean", "s1", (7, 1042))
    member = MemberStore(3, "clean", status, epoch=4, position=(7, 1042), label="./b3")
    assert member_of(member_doc(member)) == member
    transient = MemberStore(4, "transient")
    assert member_of(member_doc(transient)) == transient


def test_describe_store_tells_transient_empty_and_clean(tmp_path):
    assert describe_store(tmp_path / "none") == ("transient", None, 0, None)
    data = tmp_path / "b1"
    store = StateStore(data / "state", map_size=1 << 24)
    store.close()
    assert describe_store(data)[0] == "empty"  # a store that holds nothing, signed or not
    ensure_status(data, "c1", 1.0)
    assert describe_store(data)[0] == "empty"
    store = StateStore(data / "state", map_size=1 << 24)
    store.apply_batch([{"type": "EpochStarted", "epoch": 3, "broker_id": 1, "now_ms": 5}], (2, 0))
    store.close()
    assert describe_store(data)[0] == "dirty"
    mark_clean(data, "s1", (2, 0))
    kind, status, epoch, position = describe_store(data)
    assert (kind, epoch, position) == ("clean", 3, (2, 0)) and status == read_status(data)
