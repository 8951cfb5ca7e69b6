"""The record a local dev cluster keeps in its run directory: where ``cluster.json`` is and what it says.

`fencepost dev up` (:mod:`devtools.devcluster`) writes the record; a command given neither
``--zk`` nor ``FENCEPOST_ZK`` reads it to find the dev cluster: its ZooKeeper hosts (``zk``), its
name (``cluster``) and, for a secure one, the admin key (``admin_key_file``, ``keys_file``). The
product reads the record here, so that it never imports the dev tools that write it; the rest of
the record (the processes started, their ports and data) is the dev tools' own.

Example::

    state = read_dev_state(DEFAULT_DEV_DIR)   # None when no dev cluster was started there
    if state:
        hosts, name = state["zk"], state.get("cluster")
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from election import ElectionError

# The run directory of `fencepost dev up` and of the commands that fall back to it.
DEFAULT_DEV_DIR = ".fencepost-dev"
STATE_FILE = "cluster.json"


class DevStateError(ElectionError):
    """A dev cluster's record exists but cannot be read."""


def state_path(dev_dir: str | os.PathLike) -> Path:
    """The ``cluster.json`` of the dev cluster whose run directory is ``dev_dir`` (made absolute)."""
    return Path(dev_dir).resolve() / STATE_FILE


def read_dev_state(dev_dir: str | os.PathLike) -> dict | None:
    """The record of the dev cluster in ``dev_dir``; None when there is none."""
    path = state_path(dev_dir)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise DevStateError(f"cannot read {path}: {exc}") from None
