"""The shard side of a chaos run, pure: the shard a fault aims at, a broker's shard processes, settling
per shard, deaths of shard processes read from a broker's log, and the replay line."""

from collections import Counter

from devtools.chaos_observe import row_name, settled, shard_process_deaths
from devtools.chaos_report import RunFacts
from devtools.fault_targets import fault_shard, shard_process_pid


def test_the_shard_of_a_fault_is_its_pick_s_and_spreads_over_every_shard():
    assert fault_shard(12345, 1) == 0
    assert fault_shard(12345, 3) == fault_shard(12345, 3)
    counts = Counter(fault_shard(pick, 3) for pick in range(3000))
    assert set(counts) == {0, 1, 2} and min(counts.values()) > 800
    # Not pick % shards: the same pick also chooses among candidates.
    assert any(fault_shard(pick, 3) != pick % 3 for pick in range(10))


def fake_proc(tmp_path, processes):
    for pid, ppid, args in processes:
        entry = tmp_path / str(pid)
        entry.mkdir()
        (entry / "stat").write_text(f"{pid} (python (x)) S {ppid} 1 1 0")
        (entry / "cmdline").write_bytes(b"\0".join(a.encode() for a in args) + b"\0")
    (tmp_path / "self").mkdir()
    return tmp_path


def test_a_broker_s_process_of_a_shard_is_its_child_started_with_that_shard(tmp_path):
    start = ["python", "-m", "cli", "broker", "start"]
    proc = fake_proc(
        tmp_path,
        [
            (100, 1, start),
            (101, 100, [*start, "--shard", "1", "--data", "d/shards/1"]),
            (102, 100, [*start, "--shard", "2", "--data", "d/shards/2"]),
            (201, 200, [*start, "--shard", "2", "--data", "e/shards/2"]),
        ],
    )
    assert shard_process_pid(100, 0, proc) == 100
    assert shard_process_pid(100, 1, proc) == 101 and shard_process_pid(100, 2, proc) == 102
    assert shard_process_pid(200, 2, proc) == 201 and shard_process_pid(200, 1, proc) is None


def row(role, position, shard=None):
    return {
        "name": "broker-0",
        "role": role,
        "position": position,
        **({"shard": shard} if shard is not None else {}),
    }


def test_a_shard_settles_with_one_leader_and_every_broker_at_one_position():
    assert settled([row("leader", [5, 9]), row("follower", [5, 9]), row("follower", [5, 9])])
    assert not settled([row("leader", [5, 9]), row("follower", [5, 8])])
    assert not settled([row("leader", [5, 9]), row(None, None)])
    assert not settled([row("follower", [5, 9]), row("follower", [5, 9])])
    assert not settled([row("leader", [5, 9]), row("leader", [5, 9])])
    assert row_name(row("leader", [1, 1], shard=2)) == "broker-0 shard 2"
    assert row_name(row("leader", [1, 1])) == "broker-0"


def test_a_shard_process_started_again_after_it_ended_is_a_death_and_an_orderly_stop_is_not():
    log = (
        "INFO broker.server.shard_children: shard 1: started its process (pid 7) on tcp://127.0.0.1:5\n"
        "WARNING broker.server.shard_children: shard 2: its process (pid 8) was killed by SIGSEGV after "
        "12.5 s: starting it again in 1.0 s\n"
        "WARNING broker.server.shard_children: shard 1: its process (pid 7) exited with code 1 after 0.4 s: "
        "starting it again in 2.0 s\n"
        "INFO broker.server.shard_children: shard 1: its process (pid 9) stopped in order: not starting it again\n"
    )
    assert shard_process_deaths("broker-1", log) == [
        {"member": "broker-1 shard 2", "exit_code": "SIGSEGV"},
        {"member": "broker-1 shard 1", "exit_code": "code 1"},
    ]


def test_the_replay_line_names_the_shards():
    facts = RunFacts(seed=4, seconds=180, hosts=0, cpu_per_host=None, planned=1, duration_s=1.0, shards=3)
    assert facts.reproduce() == "fencepost chaos --seconds 180 --shards 3 --seed 4"
    one = RunFacts(seed=4, seconds=180, hosts=0, cpu_per_host=None, planned=1, duration_s=1.0)
    assert one.reproduce() == "fencepost chaos --seconds 180 --seed 4"
