"""The report of a chaos run: faults by kind, operations, anomalies and how to replay it; and its text form.

:func:`build_report` turns what a run recorded (the injector's fault events, the
history and what was observed after the load, the anomalies of the check) into one
JSON-able dict (``shards``: the cluster's; each fault event aimed at a shard names it, and
``operations.acknowledged_by_shard`` shows how the keys spread);
``faults.partitions`` counts the network cuts injected and
``faults.network`` those plus the added latencies; ``faults.zk_servers_killed`` the single
ZooKeeper servers killed in a run on an ensemble (``zk_servers``). :func:`format_report` is the
human form that ``fencepost chaos`` prints without ``--json``.

Example::

    report = build_report(run_facts, history, injector, anomalies)
    print(format_report(report))
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from devtools import schedule as S
from devtools.faults import Injector
from devtools.history import Anomaly, History
from election.shards import shard_of_task


@dataclass
class RunFacts:
    """What a run was asked to do and how long it took: the report's head and its replay line."""

    seed: int
    seconds: float
    hosts: int
    cpu_per_host: float | None
    planned: int
    duration_s: float
    skipped_kinds: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    shards: int = 1
    zk_servers: int = 1

    def reproduce(self) -> str:
        hosts = f" --hosts {self.hosts}" if self.hosts else ""
        cpu = f" --cpu-per-host {self.cpu_per_host:g}" if self.hosts and self.cpu_per_host else ""
        shards = f" --shards {self.shards}" if self.shards > 1 else ""
        zk = f" --zk-servers {self.zk_servers}" if self.zk_servers > 1 else ""
        return f"fencepost chaos --seconds {self.seconds:g}{hosts}{cpu}{shards}{zk} --seed {self.seed}"


def build_report(facts: RunFacts, history: History, injector: Injector, anomalies: list[Anomaly]) -> dict:
    events = sorted(injector.events, key=lambda e: e["seq"])
    injected = Counter(e["kind"] for e in events if e["injected"])
    not_injected = Counter(e["kind"] for e in events if not e["injected"])
    submits_ok = [s for s in history.submits if s.ok]
    why_not = Counter(
        (e["kind"], e["note"]) for e in events if not e["injected"] and e["kind"] not in facts.skipped_kinds
    )
    notes = facts.notes + [f"{kind} not injected ({n}): {why}" for (kind, why), n in sorted(why_not.items())]
    network = sum(n for kind, n in injected.items() if kind in S.NETWORK_KINDS)
    return {
        "seed": facts.seed,
        "seconds": facts.seconds,
        "hosts": facts.hosts,
        "shards": facts.shards,
        "zk_servers": facts.zk_servers,
        "duration_s": round(facts.duration_s, 1),
        "faults": {
            "planned": facts.planned,
            "injected": sum(injected.values()),
            "network": network,
            "partitions": network - injected.get(S.LATENCY, 0),
            "zk_servers_killed": injected.get(S.KILL_ZK_SERVER, 0),
            "by_kind": dict(sorted(injected.items())),
            "not_injected": dict(sorted(not_injected.items())),
            "skipped_kinds": facts.skipped_kinds,
            "events": events,
        },
        "operations": {
            "submits_ok": len(submits_ok),
            "submits_failed": len(history.submits) - len(submits_ok),
            "keys": len({s.key for s in history.submits}),
            "keys_acknowledged": len({s.key for s in submits_ok}),
            "completions_ok": sum(1 for c in history.completions if c.ok),
            "completions_refused": sum(1 for c in history.completions if not c.ok),
            "tasks_checked": sum(1 for t in history.observed.tasks.values() if t is not None),
            "keys_resubmitted": len(history.observed.resubmits),
            "queue_total": history.observed.queue_total,
            **({"acknowledged_by_shard": by_shard(submits_ok, facts.shards)} if facts.shards > 1 else {}),
        },
        "poison_replies": dict(sorted(injector.poison_counts.items())),
        "brokers": history.observed.brokers,
        "notes": notes,
        "anomalies": [a.to_dict() for a in anomalies],
        "reproduce": facts.reproduce(),
    }


def by_shard(submits: list, shards: int) -> dict[str, int]:
    """How many acknowledged submits each shard got (its id names it): the keys spread over every shard."""
    counts = Counter(shard_of_task(s.task_id) for s in submits)
    return {str(n): counts.get(n, 0) for n in range(shards)}


def format_report(report: dict) -> str:
    """The human form of a report."""
    f, ops = report["faults"], report["operations"]
    on_hosts = f" on {report['hosts']} test hosts" if report.get("hosts") else ""
    shards = f" with {report['shards']} shards" if report.get("shards", 1) > 1 else ""
    zk = f" on {report['zk_servers']} ZooKeeper servers" if report.get("zk_servers", 1) > 1 else ""
    lines = [
        f"chaos run{on_hosts}{shards}{zk}: seed {report['seed']}, {report['seconds']:g}s of faults, "
        f"{report['duration_s']:g}s in all",
        f"faults injected: {f['injected']} of {f['planned']} planned"
        + (f" ({f['partitions']} partitions, {f['network']} network faults)" if report.get("hosts") else ""),
    ]
    lines += [f"  {kind:<20}{n}" for kind, n in f["by_kind"].items()]
    if f["not_injected"]:
        lines.append("not injected: " + ", ".join(f"{k} {n}" for k, n in f["not_injected"].items()))
    lines += [f"skipped {kind}: {why}" for kind, why in f["skipped_kinds"].items()]
    lines.append(
        f"submits: {ops['submits_ok']} ok, {ops['submits_failed']} failed ({ops['keys_acknowledged']} of "
        f"{ops['keys']} keys acknowledged); completions: {ops['completions_ok']} ok, "
        f"{ops['completions_refused']} refused"
    )
    if ops.get("acknowledged_by_shard"):
        spread = ", ".join(f"shard {n} {count}" for n, count in ops["acknowledged_by_shard"].items())
        lines.append(f"acknowledged by shard: {spread}")
    lines.append(
        f"checked: {ops['tasks_checked']} tasks, {ops['keys_resubmitted']} keys resubmitted, "
        f"{ops['queue_total']} tasks in the queue"
    )
    if report.get("poison_replies"):
        lines.append("poison replies: " + ", ".join(f"{k} {n}" for k, n in report["poison_replies"].items()))
    lines += [f"note: {note}" for note in report.get("notes", [])]
    lines.append(f"anomalies: {len(report['anomalies'])}")
    lines += [f"  {a['kind']} ({a['count']}): {a['detail']}" for a in report["anomalies"]]
    lines.append(f"reproduce: {report['reproduce']}")
    if report.get("run_dir"):
        lines.append(f"logs and data kept in {report['run_dir']}")
    return "\n".join(lines)
