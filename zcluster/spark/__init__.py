"""PySpark integration (the ``spark`` extra): the exactly-once foreachBatch sink and Python data sources.

``ZClusterSink`` commits journal messages into the cluster exactly once; ``zcluster-journal`` reads journals
as a streaming source; ``zcluster`` writes KeyScoreMember rows. :func:`register` registers both data
sources with a SparkSession; :func:`local_session` starts a local one with them registered.
"""

from zcluster.spark.config import ClusterConfig
from zcluster.spark.session import local_session, register, run_available_now
from zcluster.spark.sink import BatchStats, Delete, Insert, MapperError, ZClusterSink

__all__ = [
    "BatchStats",
    "ClusterConfig",
    "Delete",
    "Insert",
    "MapperError",
    "ZClusterSink",
    "local_session",
    "register",
    "run_available_now",
]
