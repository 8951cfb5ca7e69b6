"""A secure cluster (CURVE keys, roles) on real processes: who gets in, who is refused, and failover still works.

Members get keys named after their addresses (the rule clients pin servers by);
the test process does its one-off pings and status requests with an admin key.
"""

from __future__ import annotations

import signal
import time

import pytest

from broker.api.client import BrokerUnavailable, Client, ClientError
from devtools.procs import free_port as _free_port
from election.secure import keyring
from election.secure.keyring import load_client_keys, server_name
from election.secure.keys import new_key_pair, write_key_pair
from election.wire import codes
from election.wire.exchange import exchange
from tests.support.harness import BrokerCluster, wait_for

pytestmark = pytest.mark.timeout(150)


class Keys:
    """Key files in one directory and a keys file listing the ones admitted."""

    def __init__(self, root) -> None:
        self.dir, self.file, self.lines = root / "keys", root / "cluster.keys", []

    def make(self, role: str, name: str, listed: bool = True) -> str:
        pair = new_key_pair(role, name)
        secret, _ = write_key_pair(pair, self.dir)
        if listed:
            self.lines.append(pair.public_line())
            self.file.write_text("\n".join(self.lines) + "\n")
        return str(secret)


def _start_secure(procs, cluster, keys: Keys, kind: str, address: str) -> object:
    data = procs.workdir / f"{kind}-{address.rsplit(':', 1)[1]}"
    args = [
        kind,
        "start",
        "--data",
        str(data),
        "--listen",
        address,
        "--zk",
        cluster.hosts,
        "--cluster",
        cluster.name,
        "--key-file",
        str(keys.dir / f"{server_name(address)}.secret"),
        "--keys-file",
        str(keys.file),
    ]
    if kind == "broker":
        args += ["--zk-session-timeout-s", "2.0"]
    env = {"FENCEPOST_INIT_IF_MISSING": "1", "FENCEPOST_ZK_SESSION_FILE": f"{data}.zk-session"}
    return procs.start(kind, args, address=address, data_dir=data, env=env)


def test_a_secure_cluster_admits_keys_by_role_refuses_the_rest_and_fails_over(
    cluster, procs, tmp_path, monkeypatch
):
    keys = Keys(tmp_path)
    admin_file = keys.make("admin", "admin")
    producer, worker = keys.make("producer", "shop"), keys.make("worker", "thumbs")
    stranger = keys.make("producer", "stranger", listed=False)
    addresses = {
        kind: [f"tcp://127.0.0.1:{_free_port()}" for _ in range(n)]
        for kind, n in (("bookie", 3), ("broker", 2))
    }
    for kind, listed in addresses.items():  # every member's key is listed before any member starts
        for address in listed:
            keys.make(kind, server_name(address))
    bookies = [_start_secure(procs, cluster, keys, "bookie", a) for a in addresses["bookie"]]
    brokers = [_start_secure(procs, cluster, keys, "broker", a) for a in addresses["broker"]]
    admin = load_client_keys(admin_file, keys.file)
    monkeypatch.setattr(keyring, "_process", {"keys": admin})  # this process's pings and status: admin
    clients = []

    def client(key_file: str | None, **options) -> Client:
        made = Client(
            zk=cluster.hosts,
            cluster=cluster.name,
            key_file=key_file,
            keys_file=keys.file if key_file else None,
            **options,
        )
        clients.append(made)
        return made

    try:
        procs.wait_ready(bookies + brokers)
        bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
        first = bc.wait_leader()
        shop, thumbs = client(producer, timeout=20.0), client(worker, timeout=20.0)
        task_id = shop.submit("imgs", b"cat.png", key="k1")
        [leased] = thumbs.call("lease", worker="w1", queues=["imgs"], max_tasks=1, wait_ms=0)["tasks"]
        thumbs.call(
            "complete", task_id=leased["task_id"], attempt=leased["attempt"], worker="w1", result=b"ok"
        )
        assert shop.get(task_id)["state"] == "done"
        depths = exchange(first["address"], "status")["queues"]

        # A worker key may not submit or purge; a bookie refuses a worker's fence. Nothing changes.
        for attempt in (
            lambda: thumbs.submit("imgs", b"dog.png"),
            lambda: thumbs.purge("imgs", states=["done"]),
        ):
            with pytest.raises(ClientError) as refused:
                attempt()
            assert refused.value.code == codes.E_FORBIDDEN
        fence = exchange(addresses["bookie"][0], "fence", keys=load_client_keys(worker, keys.file), ledger=0)
        assert fence["error"] == codes.E_FORBIDDEN
        # No key, an unknown key: no connection at all, so the call fails at its deadline, saying why.
        monkeypatch.setattr(keyring, "_process", {"keys": None})
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable, match="secure cluster"):
            client(None, timeout=2.0).submit("imgs", b"plain")
        assert time.monotonic() - started < 10
        with pytest.raises(BrokerUnavailable):
            client(stranger, timeout=2.0).submit("imgs", b"stranger")
        monkeypatch.setattr(keyring, "_process", {"keys": admin})
        status = exchange(first["address"], "status")
        assert status["queues"] == depths and status["secure"] is True
        assert status["counters"]["forbidden"] == 2
        assert shop.get(task_id)["state"] == "done"

        # Pinned to the wrong server key: the handshake cannot complete; an address the file lacks: never tried.
        wrong = tmp_path / "wrong.keys"
        wrong.write_text(
            keys.file.read_text()
            .replace(server_name(addresses["broker"][0]), "elsewhere-0")
            .replace(server_name(addresses["broker"][1]), server_name(addresses["broker"][0]))
            .replace("elsewhere-0", server_name(addresses["broker"][1]))
        )
        with pytest.raises(BrokerUnavailable):
            clients.append(
                Client(
                    zk=cluster.hosts, cluster=cluster.name, key_file=producer, keys_file=wrong, timeout=2.0
                )
            )
            clients[-1].submit("imgs", b"rogue")
        with pytest.raises(ClientError) as untrusted:
            clients.append(Client(brokers=["tcp://127.0.0.1:1"], key_file=producer, keys_file=keys.file))
            clients[-1].submit("imgs", b"nowhere")
        assert untrusted.value.code == codes.E_UNTRUSTED_SERVER

        # A key added to the file is admitted after SIGHUP, without a restart.
        late = keys.make("producer", "late")
        for proc in brokers:
            proc._signal(signal.SIGHUP)
        wait_for(lambda: _submits(cluster, late, keys.file), 10, "the new key admitted after SIGHUP")

        # The `status` command with the admin key says the cluster is secure.
        shown = procs.run(
            [
                "status",
                "--zk",
                cluster.hosts,
                "--cluster",
                cluster.name,
                "--key-file",
                admin_file,
                "--keys-file",
                str(keys.file),
            ]
        )
        assert b"secure: yes" in shown.stdout, shown.stderr

        # Brokers and bookies talk with their keys: a leader SIGKILL fails over.
        bc.leader_proc().kill()
        bc.wait_leader(timeout=30, not_id=first["broker_id"])
        assert shop.submit("imgs", b"cat.png", key="k1") == task_id
        assert shop.get(shop.submit("imgs", b"after"))["state"] == "waiting"
    finally:
        for made in clients:
            made.close()
        procs.stop_all()


def _submits(cluster, key_file: str, keys_file) -> bool:
    with Client(
        zk=cluster.hosts, cluster=cluster.name, key_file=key_file, keys_file=keys_file, timeout=1.5
    ) as late:
        try:
            late.submit("imgs", b"late")
            return True
        except BrokerUnavailable:
            return False
