"""A real Redis Cluster on loopback ports, with every slot assigned, for the tests and the benchmarks.

Built on :mod:`zcluster.testing.servers` (the same binary discovery, temporary directories and clean-up);
besides starting and stopping nodes, it can move a hash slot between nodes the way ``redis-cli`` reshards.
"""

from __future__ import annotations

import time

from zcluster._keys import SLOTS
from zcluster.errors import ZClusterError
from zcluster.testing.servers import _LocalGroup

__all__ = ["LocalRedisCluster"]


class LocalRedisCluster(_LocalGroup):
    """A real Redis Cluster of ``masters`` cluster-enabled nodes with all 16384 slots assigned.

    Slots are split evenly in order; the constructor returns once every node reports ``cluster_state:ok``
    and agrees on the slot map. ``url`` is a seed node for :meth:`zcluster.Cluster.from_cluster_url`.
    """

    def __init__(self, masters: int = 3, *, binary: str | None = None, timeout: float = 30.0) -> None:
        super().__init__(binary)
        try:
            for _ in range(masters):
                s = self._new_server(
                    (
                        "--cluster-enabled",
                        "yes",
                        "--cluster-node-timeout",
                        "2000",
                        "--cluster-config-file",
                        "nodes.conf",
                    )
                )
                s.start()
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

    def _form(self, timeout: float) -> None:
        n = len(self.servers)
        for i, s in enumerate(self.servers):
            lo, hi = SLOTS * i // n, SLOTS * (i + 1) // n - 1
            with s.client() as c:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
        with self.servers[0].client() as first:
            for s in self.servers[1:]:
                first.execute_command("CLUSTER", "MEET", "127.0.0.1", s.port)
        self.wait_ok(timeout)

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every live node says ``cluster_state:ok`` and sees the same slot map."""
        deadline = time.monotonic() + timeout
        while True:
            states, maps = [], []
            for s in self.servers:
                if s.process is None:
                    continue
                with s.client(socket_timeout=2) as c:
                    info = c.execute_command("CLUSTER", "INFO").decode()
                    states.append("cluster_state:ok" in info)
                    maps.append(sorted((r[0], r[1], r[2][1]) for r in c.execute_command("CLUSTER", "SLOTS")))
            if all(states) and all(m == maps[0] for m in maps) and sum(r[1] - r[0] + 1 for r in maps[0]) == SLOTS:
                return
            if time.monotonic() > deadline:
                raise ZClusterError(f"Redis Cluster not ok after {timeout}s (states {states})")
            time.sleep(0.05)

    def slot_owner(self, slot: int) -> int:
        """Index of the server that owns ``slot`` according to the first live node."""
        with self.servers[0].client() as c:
            for lo, hi, master, *_ in c.execute_command("CLUSTER", "SLOTS"):
                if lo <= slot <= hi:
                    return next(i for i, s in enumerate(self.servers) if s.port == int(master[1]))
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
