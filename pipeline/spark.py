"""The Spark session of the pipeline: local by default, quiet, loopback only, the ``fencepost`` source registered.

Spark's Python workers must import this project, so they run the interpreter
that started the pipeline (``PYSPARK_PYTHON`` from :data:`sys.executable`).
A local master binds the driver to 127.0.0.1: nothing listens on or reaches
another address.

Example::

    spark = spark_session()                         # local[*]
    spark = spark_session(master="spark://10.0.0.5:7077", app_name="fencepost-export")
    spark.read.format("fencepost").option("zk", hosts).option("cluster", "dev").load()
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile

from pyspark.sql import SparkSession

from pipeline.source import FencepostDataSource

DEFAULT_MASTER = "local[*]"
# Spark's own log4j profile prints INFO and WARN lines (native libraries, hostnames) that say
# nothing about the pipeline; errors still show.
_LOG4J = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n
"""


def _log4j_file() -> str:
    fd, path = tempfile.mkstemp(prefix="fencepost-log4j2-", suffix=".properties")
    with os.fdopen(fd, "w") as fh:
        fh.write(_LOG4J)
    return path


def spark_session(
    master: str = DEFAULT_MASTER, app_name: str = "fencepost", shuffle_partitions: int | None = None
) -> SparkSession:
    """A Spark session (the running one if there is one) with the ``fencepost`` data source registered."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    local = master.startswith("local")
    log4j = _log4j_file()
    if local:
        # Otherwise Spark binds to the first non-loopback interface it finds.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log4j}")
        # Each query here is small next to Spark's default of 200 shuffle partitions.
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions or 8))
        # At this value (Int.MaxValue) Spark batches rows for the Python workers by count only; below it
        # it sizes the whole Arrow batch again after every row (15% of the executors' JVM samples in analyze).
        .config("spark.sql.execution.arrow.maxBytesPerBatch", str(2**31 - 1))
        # Executor and Python worker talk over a Unix socket: a Python task of one row took 66 ms on
        # local[1] over loopback TCP, 25 ms with it (the worker was idle for most of the difference).
        .config("spark.python.unix.domain.socket.enabled", "true")
    )
    if local:
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    try:
        spark = builder.getOrCreate()
    finally:
        os.unlink(log4j)  # read once, when the driver's JVM starts
    # py4j logs every gateway connection it closes at INFO.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(FencepostDataSource)
    return spark
