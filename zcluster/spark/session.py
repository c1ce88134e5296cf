"""A local SparkSession for demos and tests, with zcluster's data sources registered."""

from __future__ import annotations

import os
import sys
from typing import Any


def register(spark: Any) -> None:
    """Register ``zcluster-journal`` (streaming and batch source) and ``zcluster`` (batch and streaming writer)."""
    from zcluster.spark.batch_source import JournalDataSource
    from zcluster.spark.writer import TupleDataSource

    spark.dataSource.register(JournalDataSource)
    spark.dataSource.register(TupleDataSource)


def local_session(master: str = "local[2]", app: str = "zcluster", *, connect: bool = False, **conf: str) -> Any:
    """``SparkSession`` on this machine, quiet and small, with zcluster's data sources registered.

    Python workers run this interpreter (``PYSPARK_PYTHON``, unless set; so they see the same packages: a real
    cluster's workers need one that has zcluster, see the README); the UI is off; shuffles use
    as many partitions as there are cores. Unless ``SPARK_HOME`` is set, a pip-installed pyspark's Python
    processes import it from this interpreter's own packages (see :func:`_bytecode_spark_home`): about
    0.8 s less for each one Spark starts, and a streaming query from a Python data source starts one
    (when this call starts the process's JVM: a JVM already running keeps the environment it had).
    ``connect=True`` starts a local Spark Connect server instead
    (``SparkSession.builder.remote(master)``; needs the ``connect`` extra) and returns its client session.
    Spark binds to loopback only (``SPARK_LOCAL_IP``, and the Connect server's address), unless told otherwise.
    """
    import warnings

    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only: nothing leaves this machine
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if "SPARK_HOME" not in os.environ and os.environ["PYSPARK_PYTHON"] == sys.executable:
        home = _bytecode_spark_home()
        if home is not None:
            os.environ["SPARK_HOME"] = home
    builder = SparkSession.builder.remote(master) if connect else SparkSession.builder.master(master)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        "spark.driver.memory": "1g",
        **({"spark.connect.grpc.binding.address": "127.0.0.1"} if connect else {}),  # loopback, as SPARK_LOCAL_IP
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


def _bytecode_spark_home() -> str | None:
    """A SPARK_HOME for a pip-installed pyspark without ``python/lib/pyspark.zip``, or None.

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on every Python worker's path. Python never
    caches the bytecode of modules imported from a zip, so each new Python process (a daemon, the planner
    of a Python data source, a streaming source's process, started for every query) compiles pyspark
    again: about 0.8 s of the 1 s it takes to start here. The installed package is the very same code,
    with its bytecode cached. This home links everything of the package's but ``python``, so workers find
    no zip and import the installed pyspark (PYSPARK_PYTHON must then be this interpreter).
    """
    import hashlib
    import importlib.util
    import tempfile
    from pathlib import Path

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    package = Path(spec.origin).resolve().parent
    if not (package / "jars").is_dir() or not (package / "bin" / "spark-submit").is_file():
        return None  # not a pip-installed pyspark: leave Spark's own layout alone
    import pyspark

    name = f"zcluster-spark-home-{pyspark.__version__}-{os.getuid()}-{hashlib.sha1(bytes(package)).hexdigest()[:10]}"
    home = Path(tempfile.gettempdir()) / name
    if (home / "jars").exists():
        return str(home)
    building = Path(tempfile.mkdtemp(prefix=name + "."))
    for entry in package.iterdir():
        if entry.name != "python":
            (building / entry.name).symlink_to(entry)
    try:
        building.rename(home)
    except OSError:  # another process built it first (or a stale one is in the way: then Spark's own)
        for entry in building.iterdir():
            entry.unlink()
        building.rmdir()
    return str(home) if (home / "jars").exists() else None


def run_available_now(
    spark: Any,
    sink: Any,
    journals: str,
    checkpoint: str | os.PathLike[str],
    selector: str = "",
    rows: str | None = None,
    partitions: int | None = None,
    **options: str | int,
) -> Any:
    """Read everything the journals hold now into ``sink`` (a foreachBatch function) and wait for the end.

    One streaming query with ``trigger(availableNow=True)`` over ``zcluster-journal``; run it again with the
    same ``checkpoint`` to continue where it stopped. ``rows`` is the source's option: by default
    ``ranges`` for a :class:`ZClusterSink` that has its ``journals`` (it reads the bytes itself), else
    ``frames``. ``partitions`` is the source's ``numPartitions``: by default the session's default
    parallelism (on Spark Connect, its ``spark.default.parallelism`` setting if it has one, else one
    partition per journal). ``options`` go to the source as they are, e.g. ``maxBytesPerTrigger=64 << 20``
    to read a backlog in bounded batches. A :class:`ZClusterSink`'s figures are observed into the query's
    progress (:meth:`ZClusterSink.observe`). Returns the finished query; raises its failure.
    """
    from zcluster.spark.sink import ZClusterSink

    if rows is None:
        rows = "ranges" if isinstance(sink, ZClusterSink) and sink.job.journals is not None else "frames"
    if partitions is None:
        partitions = _default_parallelism(spark)
    reader = (
        spark.readStream.format("zcluster-journal")
        .option("journals", journals)
        .option("selector", selector)
        .option("rows", rows)
    )
    if partitions is not None:
        reader = reader.option("numPartitions", str(partitions))
    for name, value in options.items():
        reader = reader.option(name, str(value))
    stream = reader.load()
    if isinstance(sink, ZClusterSink):
        stream = sink.observe(stream)
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query


def _default_parallelism(spark: Any) -> int | None:
    """The session's default parallelism, or None where it is not known (Spark Connect without the setting)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except AttributeError:  # Spark Connect: no SparkContext in the client (PySparkAttributeError)
        setting = spark.conf.get("spark.default.parallelism", None)
        return int(setting) if setting else None
