"""A test network: hosts in network namespaces on one bridge, with CPU caps, latency, loss and cuts.

Everything made is written first into ``<run_dir>/hosts.json``, so a command killed
half-way leaves a record from which :meth:`TestNet.destroy` removes what it made
(namespaces, veths, the bridge, CPU groups, firewall guard rules, delayers), and
:meth:`TestNet.ensure` builds the same network again (same number, same addresses)
after a ``dev down``. Host ``local`` is the machine itself (its address on the
bridge), where the CLI and the tests run.

Example::

    net = TestNet(Path(".fencepost-dev"))
    net.create(["zk", "h1", "h2", "h3"], cpus=0.5, latency_ms=5)
    command = net.command("h1", ["python", "-m", "cli", "bookie", "start", ...])
    net.partition(["h1"], ["zk", "h2", "h3", "local"])
    net.heal()
    net.destroy()
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from devtools.hosts.cgroup import CpuGroups
from devtools.hosts.firewall import Firewall
from devtools.hosts.latency import Latency
from devtools.hosts.netns import NetLinks, default_route, in_netns, missing_tools, run
from devtools.hosts.plan import (
    LOCAL,
    MAX_NETWORKS,
    HostsError,
    NetPlan,
    cut_pairs,
    cut_rules,
    heal_pairs,
)
from devtools.procs import pid_alive
from election.local.files import write_json_atomically

RECORD = "hosts.json"


def hosts_unsupported() -> str | None:
    """Why test hosts cannot run here (None: they can): they need root, iproute2 and iptables."""
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces, a bridge, iptables)"
    missing = missing_tools()
    if missing:
        return f"test hosts need {', '.join(missing)} (Debian: iproute2, iptables)"
    return None


class TestNet:
    """The test network recorded in ``run_dir`` (see the module docstring)."""

    __test__ = False  # not a pytest class, whatever its name

    def __init__(self, run_dir: Path, private: bool = False) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.path = self.run_dir / RECORD
        self.owner = "fencepost:" + hashlib.sha1(str(self.run_dir).encode()).hexdigest()[:12]
        self.firewall = Firewall()
        self.latency = Latency(self.run_dir, private)
        # Chaos faults and the monitor change cuts and delays from several threads.
        self._lock = threading.RLock()

    # -- the record ---------------------------------------------------------------------------

    def read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text()) or None
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise HostsError(f"{self.path} is damaged ({exc}): remove the namespaces by hand") from None

    def _write(self, record: dict) -> None:
        write_json_atomically(self.path, record, indent=2)

    def _record(self) -> dict:
        record = self.read()
        if record is None:
            raise HostsError(f"no test network recorded in {self.path}")
        return record

    def address(self, host: str) -> str:
        """The address of ``host`` (``local``: the machine's own on the bridge)."""
        record = self._record()
        if host == LOCAL:
            return record["gateway"]
        return self._host(record, host)["address"]

    def hosts(self) -> dict[str, dict]:
        return dict(self._record()["hosts"])

    @staticmethod
    def _host(record: dict, name: str) -> dict:
        if name not in record["hosts"]:
            known = ", ".join([LOCAL, *record["hosts"]])
            raise HostsError(f"no host {name!r} in this test network (hosts: {known})")
        return record["hosts"][name]

    def command(self, host: str, command: list[str]) -> list[str]:
        """``command`` run on ``host``: inside its namespace, in its CPU group if it has one."""
        entry = self._host(self._record(), host)
        prefix = CpuGroups.launcher(Path(entry["cgroup"])) if entry.get("cgroup") else []
        return [*prefix, *in_netns(entry["netns"], command)]

    # -- making and removing --------------------------------------------------------------------

    def create(self, hosts: list[str], cpus: float | None = None, latency_ms: float = 0.0) -> dict:
        """Make a new network with ``hosts`` on a free number; HostsError (nothing left behind) if it fails."""
        reason = hosts_unsupported()
        if reason:
            raise HostsError(reason)
        if self.built():
            raise HostsError(f"{self.path} records a test network that exists: destroy it first")
        self.path.unlink(missing_ok=True)  # the record of one destroyed: a new network starts afresh
        if len(set(hosts)) != len(hosts):
            raise HostsError("host names must differ")
        taken = run(["ip", "-o", "-4", "addr", "show"]).stdout
        with self._lock:
            for index in range(MAX_NETWORKS):
                plan = NetPlan(index)
                if f" {plan.subnet.rsplit('.', 1)[0]}." in taken:
                    continue
                record = self._new_record(plan, hosts, cpus, latency_ms)
                self._write(record)
                try:
                    NetLinks(plan, self.owner).claim_bridge()
                except HostsError:
                    if NetLinks(plan, self.owner).bridge_owner() not in (None, self.owner):
                        self.path.unlink()
                        continue
                    raise
                try:
                    return self._build(record)
                except BaseException:
                    self.destroy()
                    raise
        raise HostsError(f"every test network number 0-{MAX_NETWORKS - 1} is taken")

    def _new_record(self, plan: NetPlan, hosts: list[str], cpus: float | None, latency_ms: float) -> dict:
        entries = {}
        for ordinal, name in enumerate(hosts, start=1):
            host = plan.host(name, ordinal)
            entries[name] = {**host.as_record(), "veth": host.veth, "cpus": cpus, "latency_ms": latency_ms}
            entries[name].update(cgroup=None, loss_pct=0.0, delayer_pid=None)
        return {
            "index": plan.index,
            "owner": self.owner,
            "bridge": plan.bridge,
            "subnet": plan.subnet,
            "gateway": plan.gateway,
            "hosts": entries,
            "cuts": [],
        }

    def add_host(self, name: str) -> dict:
        """One more host in the running network, with the CPU cap and latency of the first one."""
        with self._lock:
            record = self._record()
            if name in record["hosts"]:
                raise HostsError(f"host {name!r} exists")
            first = next(iter(record["hosts"].values()), {})
            ordinal = 1 + max((h["ordinal"] for h in record["hosts"].values()), default=0)
            host = NetPlan(record["index"]).host(name, ordinal)
            record["hosts"][name] = {**host.as_record(), "veth": host.veth, "cpus": first.get("cpus")}
            record["hosts"][name].update(latency_ms=first.get("latency_ms", 0.0), cgroup=None)
            record["hosts"][name].update(loss_pct=0.0, delayer_pid=None)
            self._write(record)
            return self._build(record)

    def built(self) -> bool:
        """True if the recorded network's bridge exists (it was made and not destroyed)."""
        record = self.read()
        return bool(record) and NetLinks(NetPlan(record["index"]), self.owner).bridge_owner() == self.owner

    def ensure(self) -> dict:
        """Build the recorded network again where it is missing (after `dev down`), cuts healed."""
        with self._lock:
            record = self._record()
            record["cuts"] = []
            return self._build(record)

    def _build(self, record: dict) -> dict:
        plan = NetPlan(record["index"])
        links = NetLinks(plan, self.owner)
        links.claim_bridge()
        self.firewall.guard_bridge(plan.bridge)
        groups = None
        for name, entry in record["hosts"].items():
            links.add_host(plan.host(name, entry["ordinal"]))
            self.firewall.prepare_host(entry["netns"])
            if entry.get("cpus"):
                groups = groups or CpuGroups.detect()
                entry["cgroup"] = str(groups.make(f"{plan.index}-{name}", entry["cpus"]))
                record["cpu_version"] = groups.version
            self._write(record)
            self._apply_net(record, name)
        self._apply_cuts(record)
        return record

    def destroy(self) -> None:
        """Remove everything the record names (what is already gone is skipped); the record stays."""
        with self._lock:
            record = self.read()
            if record is None:
                return
            plan = NetPlan(record["index"])
            links = NetLinks(plan, self.owner)
            owned = links.bridge_owner() in (None, self.owner)
            for name, entry in record["hosts"].items():
                self.latency.stop(entry["netns"], entry.get("delayer_pid"))
                entry["delayer_pid"] = None
                if owned:
                    links.remove_host(plan.host(name, entry["ordinal"]))
                if entry.get("cgroup"):
                    CpuGroups.detect().remove(Path(entry["cgroup"]))
                    entry["cgroup"] = None
            if owned:
                self.firewall.unguard_bridge(plan.bridge)
                links.remove_bridge()
            record["cuts"] = []
            self._write(record)

    # -- faults ---------------------------------------------------------------------------------

    def partition(self, group_a: list[str], group_b: list[str], one_way: bool = False) -> None:
        """Cut ``group_a`` from ``group_b`` (one-way: only what ``group_b`` sends to ``group_a`` is lost)."""
        with self._lock:
            record = self._record()
            for name in [*group_a, *group_b]:
                if name != LOCAL:
                    self._host(record, name)
            pairs = {tuple(p) for p in record["cuts"]} | cut_pairs(group_a, group_b, one_way)
            record["cuts"] = sorted(list(p) for p in pairs)
            self._write(record)
            self._apply_cuts(record)

    def heal(self, host: str | None = None) -> None:
        """Remove every cut involving ``host``, or every cut."""
        with self._lock:
            record = self._record()
            if host not in (None, LOCAL):
                self._host(record, host)
            record["cuts"] = sorted(list(p) for p in heal_pairs({tuple(p) for p in record["cuts"]}, host))
            self._write(record)
            self._apply_cuts(record)

    def cuts(self) -> list[tuple[str, str]]:
        return [tuple(p) for p in self._record()["cuts"]]

    def set_latency(self, host: str, latency_ms: float) -> None:
        with self._lock:
            record = self._record()
            self._host(record, host)["latency_ms"] = max(0.0, latency_ms)
            self._apply_net(record, host)

    def set_loss(self, host: str, loss_pct: float) -> None:
        if not 0 <= loss_pct <= 100:
            raise HostsError(f"loss must be 0-100 %, not {loss_pct}")
        with self._lock:
            record = self._record()
            self._host(record, host)["loss_pct"] = loss_pct
            self._apply_net(record, host)

    def _apply_cuts(self, record: dict) -> None:
        addresses = {name: entry["address"] for name, entry in record["hosts"].items()}
        addresses[LOCAL] = record["gateway"]
        pairs = {tuple(p) for p in record["cuts"]}
        for name, rules in cut_rules(pairs, addresses).items():
            self.firewall.set_cuts(record["hosts"][name]["netns"], rules)

    def _apply_net(self, record: dict, name: str) -> None:
        """Bring the host's delay and loss to what its entry says (the record is written after)."""
        entry = record["hosts"][name]
        running = entry.get("delayer_pid")
        if not (running and pid_alive(running) and entry.get("delayer_ms") == entry.get("latency_ms")):
            self.latency.stop(entry["netns"], running)
            entry["delayer_pid"] = entry["delayer_ms"] = None
            if entry.get("latency_ms"):
                entry["delayer_pid"] = self.latency.start(entry["netns"], entry["latency_ms"])
                entry["delayer_ms"] = entry["latency_ms"]
            self._write(record)
        delayed = entry["delayer_pid"] is not None
        self.firewall.set_net(entry["netns"], entry.get("loss_pct") or 0.0, delayed)

    # -- checks ---------------------------------------------------------------------------------

    def isolation_problems(self) -> list[str]:
        """What would let a host reach beyond the test network (empty: nothing)."""
        record = self._record()
        problems = []
        for name, entry in record["hosts"].items():
            route = default_route(entry["netns"])
            if route:
                problems.append(f"host {name} has a default route: {route}")
        for rule in self.firewall.nat_rules_for(record["subnet"]):
            problems.append(f"the machine NATs the test network: {rule}")
        forward = run(["iptables", "-S", "FORWARD"]).stdout
        if f"-i {record['bridge']} ! -o {record['bridge']}" not in forward:
            problems.append(f"nothing stops the machine forwarding from {record['bridge']}")
        return problems
