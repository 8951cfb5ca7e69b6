"""What a chaos run observes once its load stopped: the tasks, a second submit of every key, settling.

:meth:`Observer.observe` asks the leader for every task id the load heard of (submits
acknowledged, completions), submits every key once more (a key must map to the id
it had), reads the queue's size, waits until one leader serves and every broker is
at its position (:meth:`Observer.settle`), and collects the crash-like lines of the
broker logs. In a cluster of several shards the client routes each of those requests
to its shard, and settling is per shard: every shard has one leader, and every
broker's process of that shard (found through its live node, its ``status`` naming the
shard) is at the leader's position; ``brokers`` has a row per broker and shard. A
broker's shard processes write to its log, so the same scan covers them, and a line in
which a broker starts one of them again after it ended unexpectedly is a death of it
(:func:`shard_process_deaths`). :func:`bookie_notes` sums up tracebacks in bookie logs, which are
findings but not anomalies of the history. The check of what was observed is
:func:`devtools.history.check`.

Example::

    observed = Observer("chaos", "chaos", settle_timeout_s=90, shards=3).observe(dev, zk, history)
    observed.settled, observed.brokers     # [{"name": "broker-0", "shard": 2, "role": ..., ...}, ...]
    bookie_notes(dev)        # ["bookie-1: 3 traceback/crash lines in its log; most frequent: ..."]
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from broker.admin.status import ask
from broker.api.client import Client, ClientError, TaskNotFound
from devtools.devcluster import DevCluster
from devtools.fault_targets import Targets, name_of
from devtools.history import History, Observed, crash_lines
from devtools.load import payload_for

log = logging.getLogger(__name__)

RESUBMIT_CHUNK = 500
LOOKUP_THREADS = 4
# The last line of a Python traceback: "package.ErrorType: message".
ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception)\b.*")
# A broker's line on a process of one of its shards that ended unexpectedly (broker.server.shard_children).
SHARD_PROCESS_ENDED = re.compile(
    r"shard (\d+): its process \(pid \d+\) (?:exited with (code \d+)|was killed by (\S+)) after [\d.]+ s: "
    r"starting it again"
)


class Observer:
    """Observes the cluster of a chaos run after its load (see the module docstring)."""

    def __init__(self, cluster: str, queue: str, settle_timeout_s: float, shards: int = 1) -> None:
        self.cluster = cluster
        self.queue = queue
        self.settle_timeout_s = settle_timeout_s
        self.shards = shards

    def observe(self, dev: DevCluster, zk: str, history: History) -> Observed:
        obs = Observed()
        with Client(zk=zk, cluster=self.cluster, timeout=self.settle_timeout_s) as client:
            try:
                client.status()  # a leader serves again
            except ClientError as exc:
                obs.settle_problem = f"no leader after the load: {exc}"
                return self._finish(obs, dev)
            ids = sorted(
                {s.task_id for s in history.submits if s.ok} | {c.task_id for c in history.completions}
            )
            with ThreadPoolExecutor(LOOKUP_THREADS) as pool:
                for task_id, task in zip(ids, pool.map(lambda t: lookup(client, t), ids)):
                    if task is not False:
                        obs.tasks[task_id] = task
            keys = list(dict.fromkeys(s.key for s in history.submits))
            for start in range(0, len(keys), RESUBMIT_CHUNK):
                chunk = keys[start : start + RESUBMIT_CHUNK]
                try:
                    ids = client.submit_many(
                        [{"queue": self.queue, "payload": payload_for(k).encode(), "key": k} for k in chunk]
                    )
                except ClientError as exc:
                    log.warning("resubmitting %d keys failed: %s", len(chunk), exc)
                    continue
                obs.resubmits.update(zip(chunk, ids))
            counts = client.status().get("queues", {}).get(self.queue, {})
            obs.queue_total = sum(n for state, n in counts.items() if state != "delayed")
        return self._finish(obs, dev)

    def _finish(self, obs: Observed, dev: DevCluster) -> Observed:
        obs.settled, problem, obs.brokers = self.settle(dev)
        obs.settle_problem = obs.settle_problem or problem
        for member in dev.read_state()["processes"]:
            if member["kind"] == "broker":
                text = Path(member["log"]).read_text(errors="replace")
                obs.log_lines += [[name_of(member), line] for line in crash_lines(text)]
                obs.deaths += shard_process_deaths(name_of(member), text)
        return obs

    def settle(self, dev: DevCluster) -> tuple[bool, str, list[dict]]:
        """Wait until each shard has one leader and every broker is at its position in each shard; the brokers
        (a row per broker and shard) as last seen."""
        deadline = time.monotonic() + self.settle_timeout_s
        targets = Targets(dev, self.shards)
        try:
            while True:
                by_shard = {
                    shard: [self._broker_row(targets, m, shard) for m in targets.members("broker")]
                    for shard in range(self.shards)
                }
                brokers = [row for rows in by_shard.values() for row in rows]
                unsettled = [shard for shard, rows in by_shard.items() if not settled(rows)]
                if not unsettled:
                    return True, "", brokers
                if time.monotonic() > deadline:
                    seen = ", ".join(
                        f"{row_name(b)} {b['role'] or 'unreachable'} at {b['position']}"
                        for shard in unsettled
                        for b in by_shard[shard]
                    )
                    return False, f"after {self.settle_timeout_s:g}s: {seen}", brokers
                time.sleep(0.5)
        finally:
            targets.close()

    def _broker_row(self, targets: Targets, member: dict, shard: int) -> dict:
        """What broker ``member``'s process of ``shard`` says of itself (role None: it did not answer)."""
        address = targets.shard_address(member, shard)
        reply = (ask(address, "status", timeout=2.0) if address else None) or {}
        if reply.get("shard", 0) != shard:  # an address now used by another process
            reply = {}
        return {
            "name": name_of(member),
            **({"shard": shard} if self.shards > 1 else {}),
            "role": reply.get("role"),
            "position": reply.get("position"),
            "digest": reply.get("digest"),
        }


def row_name(row: dict) -> str:
    """``broker-1``, or ``broker-1 shard 2`` for a row of a cluster of several shards."""
    return f"{row['name']} shard {row['shard']}" if "shard" in row else row["name"]


def settled(rows: list[dict]) -> bool:
    """One shard's brokers have settled: one of them leads, every one answered, all at one position. Pure."""
    leaders = [b for b in rows if b["role"] == "leader"]
    positions = {tuple(b["position"]) if b["position"] else None for b in rows}
    return len(leaders) == 1 and len(positions) == 1 and None not in positions


def shard_process_deaths(member: str, log_text: str) -> list[dict]:
    """The processes of shards that broker ``member``'s log says ended unexpectedly (and were started again)."""
    return [
        {"member": f"{member} shard {m.group(1)}", "exit_code": m.group(2) or m.group(3)}
        for m in SHARD_PROCESS_ENDED.finditer(log_text)
    ]


def lookup(client: Client, task_id: str) -> dict | None | bool:
    """The task as the leader has it, None if unknown, False if it could not be asked."""
    try:
        task = client.get(task_id)
    except TaskNotFound:
        return None
    except ClientError as exc:
        log.warning("cannot look up %s: %s", task_id, exc)
        return False
    payload = task.get("payload")
    return {
        "queue": task.get("queue"),
        "state": task.get("state"),
        "payload": payload.decode(errors="replace") if isinstance(payload, bytes) else payload,
    }


def bookie_notes(dev: DevCluster) -> list[str]:
    """One note per bookie whose log holds tracebacks or crash lines."""
    return [
        note
        for member in dev.read_state()["processes"]
        if member["kind"] == "bookie"
        for note in [log_note(name_of(member), Path(member["log"]))]
        if note
    ]


def log_note(name: str, path: Path) -> str:
    """One line on the crash lines of a (bookie) log and its most frequent error, or ''."""
    text = path.read_text(errors="replace")
    crashes = crash_lines(text)
    if not crashes:
        return ""
    errors = Counter(line.strip() for line in text.splitlines() if ERROR_LINE.match(line))
    top = (
        f"; most frequent: {errors.most_common(1)[0][0][:160]} ({errors.most_common(1)[0][1]})"
        if errors
        else ""
    )
    return f"{name}: {len(crashes)} traceback/crash lines in its log{top}"
