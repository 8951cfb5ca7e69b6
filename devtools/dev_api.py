"""The HTTP API of a dev cluster (`fencepost dev up --api`): one `fencepost api` process and an admin API key.

The key is made afresh by each first `up` (``DEV_DIR/api.keys`` holds its hash, mode 0600)
and recorded with the API's address in ``cluster.json`` (``api``: ``127.0.0.1:PORT``,
``api_key``, ``api_keys_file``), so scripts and tests at the dev dir can call the API at
once. The process is a member of kind ``api`` (named ``api-0``): `dev down` stops it,
`dev up` over a stopped dev dir starts it again on its port, `dev status` lists it. On a
secure cluster it connects with the dev cluster's admin CURVE key.

Example::

    member = api_member(state, run_dir)        # the record, the key made and noted in state
    members.spawn(member); members.wait_listening(member)
"""

from __future__ import annotations

from pathlib import Path

from devtools.procs import free_port
from election.secure.api_keys import add_api_key

API_KEYS_FILE = "api.keys"
ADMIN_KEY_NAME = "dev-admin"


def api_member(state: dict, run_dir: Path) -> dict:
    """The record of the dev cluster's API process (not started); its key is made and noted in ``state``."""
    keys_file = Path(run_dir) / API_KEYS_FILE
    keys_file.unlink(missing_ok=True)  # a fresh `up`: a fresh key
    key = add_api_key(keys_file, "admin", ADMIN_KEY_NAME)
    address = f"127.0.0.1:{free_port()}"
    data = Path(run_dir) / "api-0"
    data.mkdir(parents=True, exist_ok=True)  # nothing durable: where `dev status` says it runs
    args = [
        "api",
        "--listen",
        address,
        "--api-keys-file",
        str(keys_file),
        "--zk",
        state["zk"],
        "--cluster",
        state["cluster"],
    ]
    if state.get("secure"):
        args += ["--key-file", state["admin_key_file"], "--keys-file", state["keys_file"]]
    state.update(api=address, api_key=key, api_keys_file=str(keys_file))
    return {
        "kind": "api",
        "index": 0,
        "address": address,
        "data_dir": str(data),
        "log": str(Path(run_dir) / "api-0.log"),
        "args": args,
    }
