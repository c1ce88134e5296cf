"""PySpark integration (the ``spark`` extra): thin glue over :mod:`zcluster.state`.

``ZClusterSink`` commits journal messages into the cluster exactly once (a ``foreachBatch`` function
running :class:`zcluster.state.Applier` on executors); ``zcluster-journal`` reads journals as a streaming
source; ``zcluster`` writes Insert/Delete rows. :func:`register` registers both data sources with a
SparkSession; :func:`local_session` starts a local one with them registered.
"""

from zcluster.config import ClusterConfig
from zcluster.spark.session import local_session, register, run_available_now
from zcluster.spark.sink import ZClusterSink
from zcluster.state.applier import BatchStats, MapperError
from zcluster.types import Delete, Insert

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
