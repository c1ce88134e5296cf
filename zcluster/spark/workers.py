"""What the sink's and the source's code does for the Spark Python worker process it runs in.

Spark reuses a Python worker for task after task (``spark.python.worker.reuse``, true by default), and after
every task the worker runs a full ``gc.collect()`` (``pyspark/daemon.py``), which walks every object the
process holds: the modules imported (pyspark, pyarrow, numpy, redis, zcluster: some 66k objects, about 60 ms
on a loaded 2-core machine) as much as anything a task made. That is a fixed cost of every task of every
micro-batch, paid by each worker a batch uses (the source's reader's and the sink's), on the cores the batch
needs. :func:`freeze_heap` moves what the process holds when its first task of ours starts into the
collector's permanent generation (``gc.freeze()``), so that later collections walk only what tasks make.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_heap"]

_frozen = False


def freeze_heap() -> None:
    """Freeze this process's objects for the cyclic collector, once per process (see the module).

    Frozen objects are still freed when their reference count drops to zero; only cyclic garbage present at
    the freeze is never collected: what the first task's own setup left (its unpickled function, once per
    worker process), a bounded amount. Each later call does nothing.
    """
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()
