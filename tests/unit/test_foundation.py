"""Pure pieces of the foundation: paths, settings precedence, Java version parsing, wire envelope."""

import dataclasses

import pytest

from devtools.zkserver import ZooKeeperServerError, parse_java_version
from election import ElectionError, wire
from election.cluster_config import ClusterOptions
from election.local.settings import SettingsError, load_settings
from election.paths import ClusterPaths


def test_paths_follow_the_design_layout():
    p = ClusterPaths("dev")
    assert p.config == "/fencepost/dev/config"
    assert p.ledger(42) == "/fencepost/dev/ledgers/L0000000042"
    assert ClusterPaths.ledger_id_of("L0000000042") == 42
    assert p.live_broker(3) == "/fencepost/dev/brokers/live/3"
    with pytest.raises(ElectionError):
        ClusterPaths("a/b")


@dataclasses.dataclass
class Sample:
    port: int = 1
    name: str = "x"
    fsync: bool = True

    def validate(self):
        if self.port < 0:
            raise SettingsError("port must be >= 0")


def test_settings_precedence_flags_env_toml_default(tmp_path):
    toml = tmp_path / "fencepost.toml"
    toml.write_text('[sample]\nport = 3\nname = "from-toml"\n')
    env = {"FENCEPOST_PORT": "5", "FENCEPOST_FSYNC": "off"}
    cfg = load_settings(Sample, "sample", flags={"port": 7, "name": None}, env=env, toml_path=toml)
    assert (cfg.port, cfg.name, cfg.fsync) == (7, "from-toml", False)
    cfg = load_settings(Sample, "sample", flags={}, env=env, toml_path=toml)
    assert cfg.port == 5
    cfg = load_settings(Sample, "sample", flags={}, env={}, toml_path=tmp_path / "absent.toml")
    assert cfg == Sample()


def test_settings_errors_are_clear(tmp_path):
    with pytest.raises(SettingsError, match="must be a number"):
        load_settings(Sample, "sample", env={"FENCEPOST_PORT": "many"}, toml_path=tmp_path / "x")
    with pytest.raises(SettingsError, match="port must be >= 0"):
        load_settings(Sample, "sample", flags={"port": -1}, env={}, toml_path=tmp_path / "x")
    bad = tmp_path / "bad.toml"
    bad.write_text("[sample]\nbogus = 1\n")
    with pytest.raises(SettingsError, match="unknown keys"):
        load_settings(Sample, "sample", env={}, toml_path=bad)


def test_java_version_parsing():
    assert parse_java_version('openjdk version "17.0.15" 2025-04-15') == 17
    assert parse_java_version('java version "1.8.0_392"') == 8
    assert parse_java_version('openjdk version "21" 2023-09-19') == 21
    with pytest.raises(ZooKeeperServerError):
        parse_java_version("no version here")


def test_cluster_options_validate_and_compare():
    opts = ClusterOptions()
    assert opts.validate() is opts
    with pytest.raises(ElectionError):
        ClusterOptions(ack_quorum=4).validate()
    diffs = opts.differences({**dataclasses.asdict(opts), "ack_quorum": 3})
    assert diffs == ["ack_quorum: cluster has 3, this member has 2"]


@pytest.mark.parametrize(
    "frame,code",
    [
        (b"\xc1\xc1garbage", wire.E_MALFORMED),
        (wire.encode([1, 2, 3]), wire.E_MALFORMED),
        (wire.encode({"v": 99, "op": "ping", "rid": 1}), wire.E_VERSION),
        (wire.encode({"v": 1, "op": "nope", "rid": 1}), wire.E_UNKNOWN_OP),
        (b"x" * 2000, wire.E_OVERSIZED),
    ],
)
def test_wire_rejects_bad_frames_with_codes(frame, code):
    with pytest.raises(wire.WireError) as info:
        wire.decode_request(frame, {"ping"}, max_bytes=1000)
    assert info.value.code == code


def test_a_request_without_an_id_is_decoded_with_a_null_one():
    # Found by the wire fuzzer: a bookie handler read msg["rid"] and answered ``internal``.
    assert wire.decode_request(wire.encode({"v": 1, "op": "ping"}), {"ping"})["rid"] is None


def test_a_version_nested_deeper_than_repr_recurses_is_refused():
    # Found by the wire fuzzer: quoting it in the error message raised RecursionError (``internal``).
    frame = b"\x83\xa1v" + b"\x81\xa1a" * 1020 + b"\x01\xa2op\xa4ping\xa3rid\x07"
    with pytest.raises(wire.WireError) as info:
        wire.decode_request(frame, {"ping"})
    assert info.value.code == wire.E_VERSION and info.value.rid == 7 and len(info.value.message) < 200


def test_wire_roundtrip_and_error_reply():
    msg = wire.decode_request(wire.encode(wire.request("ping", 9, x=b"\x00")), {"ping"})
    assert msg["rid"] == 9 and msg["x"] == b"\x00"
    with pytest.raises(wire.RemoteError) as info:
        wire.check_reply(wire.error_reply(9, "fenced", "ledger 3 is fenced"))
    assert info.value.code == "fenced"


@pytest.mark.parametrize("listen", ["tcp://*:5601", "tcp://0.0.0.0:5601"])
def test_wildcard_listen_addresses_are_refused_with_a_reason(listen):
    from broker.server.config import BrokerConfig, BrokerConfigError
    from ledger import LedgerError
    from ledger.bookie.config import BookieConfig

    with pytest.raises(BrokerConfigError, match="wildcard"):
        BrokerConfig(listen=listen).validate()
    with pytest.raises(LedgerError, match="wildcard"):
        BookieConfig(listen=listen).validate()
