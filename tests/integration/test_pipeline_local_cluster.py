"""`analyze` and `audit` on a real multi-executor Spark, `local-cluster[2,1,1024]` (a master, two worker
JVMs, each with its own executor and Python workers, all on this machine), give the same tables, summary
and findings as `local[2]` (the tests' session) and as the in-process engine.

local-cluster is Spark's own test mode; with PySpark installed by pip it works as long as the workers
find Spark's jars under SPARK_HOME (the pyspark package directory, which PySpark sets by itself). A worker
keeps its executors' work directories (their stdout and stderr) under SPARK_HOME/work, so the commands
run with SPARK_HOME pointing at a directory of links to pyspark's `bin` and `jars` in the test's own
temporary directory: nothing is written into the installation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyspark
import pytest

from pipeline.analyze_run import HistorySource, run_analyze
from pipeline.audit import audit_cluster, plan_audit
from pipeline.frames import ArrowFrames
from pipeline.plan import ClusterAddress
from tests.support.limits_history import write_limits_history
from tests.support.pipeline_runs import read_tables, same_history_facts

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

MASTER = "local-cluster[2,1,1024]"


def _spark_home(tmp_path: Path) -> Path:
    """A SPARK_HOME of links to the pip-installed pyspark's scripts and jars, whose `work` is the test's."""
    home = tmp_path / "spark-home"
    home.mkdir()
    package = Path(pyspark.__file__).parent
    for name in ("bin", "jars"):
        (home / name).symlink_to(package / name)
    return home


def test_analyze_and_audit_on_a_local_cluster_match_local_mode_and_the_in_process_engine(
    spark, broker_cluster, tmp_path
):
    bc = broker_cluster
    write_limits_history(bc)
    address = ClusterAddress(bc.zk_hosts, bc.cluster.name)
    here = run_analyze(ArrowFrames(), HistorySource(address=address), tmp_path / "pyarrow")
    local = run_analyze(spark, HistorySource(address=address), tmp_path / "local")
    audited = audit_cluster(spark, address, entries_per_partition=10, plan=plan_audit(address))
    assert audited.findings == []

    home = _spark_home(tmp_path)
    where = ["--zk", bc.zk_hosts, "--cluster", bc.cluster.name, "--spark", "--master", MASTER, "--json"]
    env = {"SPARK_HOME": str(home)}
    analyzed = bc.procs.run(["analyze", *where, "--out", str(tmp_path / "cluster")], timeout=600, env=env)
    assert analyzed.returncode == 0, analyzed.stderr.decode()[-3000:]
    doc = json.loads(analyzed.stdout)
    assert doc["engine"] == "spark"
    assert (
        read_tables(tmp_path / "cluster")
        == read_tables(tmp_path / "local")
        == read_tables(tmp_path / "pyarrow")
    )
    assert same_history_facts(doc) == same_history_facts(local) == same_history_facts(here)

    checked = bc.procs.run(["audit", *where, "--entries-per-partition", "10"], timeout=600, env=env)
    assert checked.returncode == 0, checked.stderr.decode()[-3000:]
    report = json.loads(checked.stdout)
    assert report["engine"] == "spark" and report["findings"] == []
    assert same_history_facts(report) == same_history_facts(audited.summary())

    # Both workers ran executors: each left its own directory under this SPARK_HOME's work.
    executors = {p.parent.name for p in (home / "work").glob("app-*/*/stderr")}
    assert len(executors) >= 2, sorted((home / "work").rglob("*"))
