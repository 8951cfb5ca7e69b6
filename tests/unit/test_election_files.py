"""The one atomic JSON writer: whole files, the caller's format and mode, no leftovers."""

import json
import os
import stat

import pytest

from election.local import files
from election.local.files import TEMP_SUFFIX, write_json_atomically


def test_writes_the_document_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "doc.json"
    write_json_atomically(target, {"b": 1, "a": [2, 3]})
    assert json.loads(target.read_text()) == {"b": 1, "a": [2, 3]}
    assert os.listdir(tmp_path) == ["doc.json"]


def test_keeps_the_callers_format_and_mode(tmp_path):
    target = tmp_path / "cookie"
    write_json_atomically(target, {"b": 1, "a": 2}, mode=0o600, sort_keys=True)
    assert target.read_bytes() == b'{"a": 2, "b": 1}'
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_a_failed_write_keeps_the_old_file_whole(tmp_path, monkeypatch):
    target = tmp_path / "doc.json"
    write_json_atomically(target, {"v": 1})

    def broken_replace(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(files.os, "replace", broken_replace)
    with pytest.raises(OSError):
        write_json_atomically(target, {"v": 2})
    assert json.loads(target.read_text()) == {"v": 1}
    assert not (tmp_path / ("doc.json" + TEMP_SUFFIX)).exists()
