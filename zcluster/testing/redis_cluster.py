"""A real Redis Cluster on loopback ports, with every slot assigned, for the tests and the benchmarks.

Built on :mod:`zcluster.testing.servers` (the same binary discovery, temporary directories and clean-up);
besides starting and stopping nodes, it can move a hash slot between nodes the way ``redis-cli`` reshards.
"""

from __future__ import annotations

import time

import redis

from zcluster._keys import SLOTS
from zcluster.errors import ZClusterError
from zcluster.testing._local import LocalGroup, LocalServer
from zcluster.testing._replication import replica_problems

__all__ = ["LocalRedisCluster", "held_by_replica"]

_NODE_OPTIONS = ("--cluster-enabled", "yes", "--cluster-node-timeout", "2000", "--cluster-config-file", "nodes.conf")


def _roles(nodes: str) -> dict[int, int | None]:
    """``CLUSTER NODES`` as port -> the port of its master (None for a master); handshakes left out."""
    rows = [line.split() for line in nodes.splitlines() if line.strip()]
    rows = [r for r in rows if "handshake" not in r[2] and "noaddr" not in r[2]]
    port = {r[0]: int(r[1].split("@")[0].rsplit(":", 1)[1]) for r in rows}
    return {port[r[0]]: port.get(r[3]) if "slave" in r[2].split(",") else None for r in rows}


class LocalRedisCluster(LocalGroup):
    """A real Redis Cluster of ``masters`` cluster-enabled nodes with all 16384 slots assigned.

    Slots are split evenly in order over ``servers`` (the masters); the constructor returns when
    :meth:`wait_ok` does. ``url`` is a seed node for :meth:`zcluster.Cluster.from_cluster_url`.

    ``replicas=k`` adds ``k`` cluster replicas per master (they join with ``CLUSTER MEET``, then
    ``CLUSTER REPLICATE <master id>``), in :meth:`replicas_of`. Redis Cluster's automatic failover stays on
    (``cluster-node-timeout`` 2000 ms): a few seconds after a master is killed one of its replicas takes over
    its slots, and the old master, started again, rejoins as a replica. ``aof=True`` starts every node with
    the AOF on (see :class:`~zcluster.testing.LocalServer`).
    """

    def __init__(
        self,
        masters: int = 3,
        *,
        binary: str | None = None,
        timeout: float = 30.0,
        replicas: int = 0,
        aof: bool = False,
    ) -> None:
        super().__init__(binary)
        try:
            for _ in range(masters):
                self._new_server(_NODE_OPTIONS, aof=aof).start()
            for i in range(masters):
                for _ in range(replicas):
                    self._new_server(_NODE_OPTIONS, aof=aof, replica_of=i).start()
            self._form(timeout)
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return self.servers[0].url

    def node_id(self, i: int) -> str:
        with self.servers[i].client() as c:
            return str(c.execute_command("CLUSTER", "MYID").decode())

    def _nodes(self) -> list[LocalServer]:
        """Every node: the masters, then the replicas of master 0, of master 1, ..."""
        return [*self.servers, *(r for i in range(len(self.servers)) for r in self._replicas[i])]

    def _form(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        n = len(self.servers)
        for i, s in enumerate(self.servers):
            lo, hi = SLOTS * i // n, SLOTS * (i + 1) // n - 1
            with s.client() as c:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
        with self.servers[0].client() as first:
            for s in self._nodes()[1:]:
                first.execute_command("CLUSTER", "MEET", "127.0.0.1", s.port)
        for i in range(n):
            master_id = self.node_id(i)
            for r in self._replicas[i]:
                with r.client() as c:
                    while True:  # "Unknown node" until gossip has told the replica about its master
                        try:
                            c.execute_command("CLUSTER", "REPLICATE", master_id)
                            break
                        except redis.ResponseError as exc:
                            if time.monotonic() > deadline:
                                msg = (
                                    f"node on port {r.port} cannot replicate {master_id} (port {self.servers[i].port})"
                                )
                                raise ZClusterError(f"{msg}: {exc}") from exc
                            time.sleep(0.05)
        self.wait_ok(max(deadline - time.monotonic(), 1.0))

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every live node agrees and every live replica is online; else :class:`ZClusterError`.

        Live nodes (masters and replicas not killed or stopped) must all say ``cluster_state:ok``, see the
        same slot map covering all 16384 slots, and list each live replica (a node whose own
        ``CLUSTER NODES`` says ``slave``) under the same master; each of those replicas must be online: its
        ``INFO replication`` says ``master_link_status:up``, its master lists it with ``state=online``, and
        ``WAIT`` on its master counts it. A replica whose master was killed therefore holds this up until
        failover has promoted it.
        """
        deadline = time.monotonic() + timeout
        while True:
            live = [s for s in self._nodes() if s.process is not None]
            states, maps, views = [], [], []
            for s in live:
                with s.client(socket_timeout=2) as c:
                    info = c.execute_command("CLUSTER", "INFO").decode()
                    states.append("cluster_state:ok" in info)
                    maps.append(sorted((r[0], r[1], r[2][1]) for r in c.execute_command("CLUSTER", "SLOTS")))
                    views.append(_roles(c.execute_command("CLUSTER", "NODES").decode()))
            problems = [
                f"node on port {s.port}: cluster_state not ok" for s, ok in zip(live, states, strict=True) if not ok
            ]
            if any(m != maps[0] for m in maps) or sum(r[1] - r[0] + 1 for r in maps[0]) != SLOTS:
                problems.append("the nodes' slot maps differ or leave slots unassigned")
            replicas = [s for s, own in zip(live, views, strict=True) if own.get(s.port) is not None]
            for s in replicas:
                master = views[live.index(s)][s.port]
                if any(v.get(s.port) != master for v in views):
                    problems.append(f"not every node lists port {s.port} as a replica of port {master}")
            if not problems:
                problems = replica_problems(replicas, live)
            if not problems:
                return
            if time.monotonic() > deadline:
                raise ZClusterError(f"Redis Cluster not ok after {timeout}s: " + "; ".join(problems))
            time.sleep(0.05)

    def slot_owner(self, slot: int) -> int:
        """Index in ``servers`` of the master that owns ``slot`` according to the first live node.

        Raises :class:`ZClusterError` if no master owns it, or if the owner is a replica promoted by failover.
        """
        live = next((s for s in self._nodes() if s.process is not None), None)
        if live is None:
            raise ZClusterError("no node of the Redis Cluster is running")
        with live.client() as c:
            for lo, hi, master, *_ in c.execute_command("CLUSTER", "SLOTS"):
                if lo <= slot <= hi:
                    port = int(master[1])
                    found = [i for i, s in enumerate(self.servers) if s.port == port]
                    if not found:
                        raise ZClusterError(f"slot {slot} is owned by port {port}, not one of the first masters")
                    return found[0]
        raise ZClusterError(f"slot {slot} has no owner")

    def migrate_slot(self, slot: int, dst: int, *, batch: int = 10, pause: float = 0.0) -> int:
        """Move ``slot`` to server ``dst`` the way redis-cli's resharding does; returns keys moved.

        IMPORTING on the target, MIGRATING on the source, MIGRATE the keys in batches (``pause`` seconds
        between batches, so writers see ASK redirects meanwhile), then SETSLOT NODE on every node.
        """
        src = self.slot_owner(slot)
        if src == dst:
            return 0
        src_id, dst_id = self.node_id(src), self.node_id(dst)
        s_srv, d_srv = self.servers[src], self.servers[dst]
        moved = 0
        with s_srv.client() as sc, d_srv.client() as dc:
            dc.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            sc.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            while True:
                keys = sc.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
                if not keys:
                    break
                sc.execute_command("MIGRATE", "127.0.0.1", d_srv.port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
                if pause:
                    time.sleep(pause)
            for s in self.servers:
                if s.process is not None:
                    with s.client() as c:
                        c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        return moved


def held_by_replica(replica: LocalServer, redis_key: bytes) -> dict[bytes, float]:
    """A Redis Cluster replica's own copy of a sorted set, member -> score (``READONLY`` on one connection:
    the replica answers from its own data instead of redirecting to its master)."""
    with replica.client(single_connection_client=True) as r:
        r.execute_command("READONLY")
        return {bytes(m): float(s) for m, s in r.zrange(redis_key, 0, -1, withscores=True)}
