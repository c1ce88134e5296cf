"""A local SparkSession for demos and tests, with zcluster's data sources registered."""

from __future__ import annotations

import os
import sys
from typing import Any


def register(spark: Any) -> None:
    """Register ``zcluster-journal`` (streaming source) and ``zcluster`` (batch and streaming writer)."""
    from zcluster.spark.source import JournalDataSource
    from zcluster.spark.writer import TupleDataSource

    spark.dataSource.register(JournalDataSource)
    spark.dataSource.register(TupleDataSource)


def local_session(master: str = "local[2]", app: str = "zcluster", *, connect: bool = False, **conf: str) -> Any:
    """``SparkSession`` on this machine, quiet and small, with zcluster's data sources registered.

    Python workers run this interpreter (so they see the same packages); the UI is off; shuffles use
    as many partitions as there are cores. ``connect=True`` starts a local Spark Connect server instead
    (``SparkSession.builder.remote(master)``; needs the ``connect`` extra) and returns its client session.
    """
    import warnings

    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only: nothing leaves this machine
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.remote(master) if connect else SparkSession.builder.master(master)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        "spark.driver.memory": "1g",
        **conf,
    }
    builder = builder.appName(app)
    for key, value in settings.items():
        builder = builder.config(key, value)
    with warnings.catch_warnings():
        # Connect starts its server with every setting, then warns that static ones cannot be changed.
        warnings.simplefilter("ignore", UserWarning)
        spark = builder.getOrCreate()
    if not connect:
        spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def run_available_now(
    spark: Any, sink: Any, journals: str, checkpoint: str | os.PathLike[str], selector: str = ""
) -> Any:
    """Read everything the journals hold now into ``sink`` (a foreachBatch function) and wait for the end.

    One streaming query with ``trigger(availableNow=True)`` over ``zcluster-journal``; run it again with the
    same ``checkpoint`` to continue where it stopped. Returns the finished query; raises its failure.
    """
    query = (
        spark.readStream.format("zcluster-journal")
        .option("journals", journals)
        .option("selector", selector)
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query
