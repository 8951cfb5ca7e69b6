"""The fencepost Spark source and `export` on a real cluster's history, with Spark in local mode."""

import pyarrow.parquet as pq
import pytest

from broker.api.client import Client
from pipeline.export import export_history, read_bookmark
from pipeline.plan import ClusterAddress
from pipeline.rows import parse_position
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# Spark gives the Python process that runs a streaming source 10 s to connect back (hard-coded in
# PythonWorkerFactory). A loaded machine sometimes takes longer to start one, and the query then ends at
# once with this error, before it read anything: such a start is tried again. Any other error fails.
SPARK_WORKER_LATE = "Python worker failed to connect back"


def submit(bc, queue, count, start=0):
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name) as client:
        return [
            client.submit(queue, f"job {i}".encode(), key=f"{queue}-{i}") for i in range(start, start + count)
        ]


def source(spark, bc, stream=False):
    reader = spark.readStream if stream else spark.read
    return reader.format("fencepost").option("zk", bc.zk_hosts).option("cluster", bc.cluster.name)


def start_tail(spark, bc, attempts: int = 3):
    """The streaming query of the submitted tasks into the memory table ``tail``, once it runs."""
    for _ in range(attempts):
        query = (
            source(spark, bc, stream=True)
            .load()
            .where("type = 'TaskSubmitted'")
            .writeStream.format("memory")
            .queryName("tail")
            .trigger(processingTime="300 milliseconds")
            .start()
        )
        wait_for(lambda: query.lastProgress is not None or not query.isActive, 60, "the query's first batch")
        error = query.exception()
        if error is None:
            return query
        if SPARK_WORKER_LATE not in str(error):
            break
    raise AssertionError(f"the streaming query failed: {error}")


def test_streaming_reader_picks_up_entries_written_after_the_query_started(spark, broker_cluster):
    bc = broker_cluster
    before = submit(bc, "early", 12)

    rows = source(spark, bc).option("entriesPerPartition", "3").load().collect()
    submitted = [r for r in rows if r.type == "TaskSubmitted"]
    assert sorted(r.task_id for r in submitted) == sorted(before)
    assert all(r.queue == "early" and r.payload_bytes in (5, 6) and r.ts_ms > 0 for r in submitted)
    assert any(r.type == "EpochStarted" for r in rows)
    positions = [(r.ledger_id, r.entry_id, r.event_index) for r in rows]
    assert len(set(positions)) == len(positions)

    query = start_tail(spark, bc)
    try:

        def seen():
            return {r.task_id for r in spark.sql("select task_id from tail").collect()}

        wait_for(lambda: seen() >= set(before), 40, "the stream to read the history")
        after = submit(bc, "late", 8)
        wait_for(lambda: seen() >= set(after), 40, "the stream to read entries written after it started")
        assert len(seen()) == len(before) + len(after)
        assert spark.sql("select count(*) from tail").collect()[0][0] == len(before) + len(after)
    finally:
        query.stop()


def test_export_twice_appends_only_the_new_entries(spark, broker_cluster, tmp_path):
    bc = broker_cluster
    out = tmp_path / "export"
    address = ClusterAddress(bc.zk_hosts, bc.cluster.name)
    first_ids = submit(bc, "exp", 10)

    first = export_history(spark, address, out)
    assert first["entries"] > 0 and first["from"] is not None
    mark = read_bookmark(out)["position"]
    assert first["to"] == f"{mark[0]}:{mark[1]}"

    second_ids = submit(bc, "exp", 6, start=10)
    second = export_history(spark, address, out)
    assert parse_position(second["from"]) > parse_position(first["to"])
    assert second["entries"] > 0

    third = export_history(spark, address, out)
    assert third["entries"] == 0 and third["files"] == 0

    files = sorted(out.glob("events/epoch=*/*.parquet"))
    assert len(files) == first["files"] + second["files"]
    table = pq.ParquetDataset([str(f) for f in files]).read()
    keys = list(
        zip(table["ledger_id"].to_pylist(), table["entry_id"].to_pylist(), table["event_index"].to_pylist())
    )
    assert len(keys) == len(set(keys)) == first["events"] + second["events"], "an entry exported twice"

    exported = spark.read.format("fencepost").load(str(out))
    ids = [r.task_id for r in exported.where("type = 'TaskSubmitted'").collect()]
    assert sorted(ids) == sorted(first_ids + second_ids)
    live = source(spark, bc).option("to", third["to"] or second["to"]).load()
    assert exported.count() == live.count()
