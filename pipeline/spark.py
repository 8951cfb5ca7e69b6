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

import os
import sys

from pyspark.sql import SparkSession

from pipeline.source import FencepostDataSource

DEFAULT_MASTER = "local[*]"


def spark_session(master: str = DEFAULT_MASTER, app_name: str = "fencepost",
                  shuffle_partitions: int | None = None) -> SparkSession:
    """A Spark session (the running one if there is one) with the ``fencepost`` data source registered."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    local = master.startswith("local")
    if local:
        # Otherwise Spark binds to the first non-loopback interface it finds.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               # Each query here is small next to Spark's default of 200 shuffle partitions.
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions or 8)))
    if local:
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(FencepostDataSource)
    return spark
