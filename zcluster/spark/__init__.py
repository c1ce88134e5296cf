"""PySpark integration (the ``spark`` extra): thin glue over :mod:`zcluster.state`.

``ZClusterSink`` commits journal messages into the cluster exactly once (a ``foreachBatch`` function
running :class:`zcluster.state.Applier` on executors); ``zcluster-journal`` reads journals as a streaming
source or, with ``spark.read``, as a batch (the committed messages: :mod:`zcluster.spark.batch_source`), and
with ``writeStream`` writes rows into journals exactly once per micro-batch (:mod:`zcluster.spark.journal_writer`);
``zcluster`` writes Insert/Delete rows. :func:`register` registers both data sources with a
SparkSession; :func:`local_session` starts a local one with them registered.

Names load lazily: a Python worker that only runs the source (it imports ``zcluster.spark.source``, and
so this package) does not import the sink, the state layer or a Redis client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zcluster import _lazy

if TYPE_CHECKING:
    from zcluster.config import ClusterConfig
    from zcluster.farm.config import FarmConfig
    from zcluster.spark.positioned import PositionedSink
    from zcluster.spark.session import local_session, register, run_available_now
    from zcluster.spark.sink import ZClusterSink
    from zcluster.state.applier import Mapper
    from zcluster.state.batch import BatchStats
    from zcluster.types import Count, Delete, Incr, Insert

_WHERE = {
    "ClusterConfig": "zcluster.config",
    **dict.fromkeys(["local_session", "register", "run_available_now"], "zcluster.spark.session"),
    "ZClusterSink": "zcluster.spark.sink",
    "PositionedSink": "zcluster.spark.positioned",
    "FarmConfig": "zcluster.farm.config",
    "Mapper": "zcluster.state.applier",
    "BatchStats": "zcluster.state.batch",
    **dict.fromkeys(["Count", "Delete", "Incr", "Insert"], "zcluster.types"),
}

__all__ = [
    "BatchStats",
    "ClusterConfig",
    "Count",
    "Delete",
    "FarmConfig",
    "Incr",
    "Insert",
    "Mapper",
    "PositionedSink",
    "ZClusterSink",
    "local_session",
    "register",
    "run_available_now",
]

__getattr__, __dir__ = _lazy.exports(__name__, _WHERE, __all__)
