"""A real Redis Cluster on loopback ports, with every slot assigned, for the tests and the benchmarks.

Built on :mod:`zcluster.testing.servers` (the same binary discovery, temporary directories and clean-up);
besides starting and stopping nodes, it can move a hash slot between nodes the way ``redis-cli`` reshards,
and grow the cluster as an operator does: :meth:`LocalRedisCluster.add_master`, then
:meth:`LocalRedisCluster.reshard` (through ``redis-cli --cluster`` itself when it is installed).

Why this module is long: one class holds everything a test does to a real Redis Cluster (forming it, waiting
until every node agrees, killing and starting nodes without letting one take its slots back, resharding
the built-in way and through redis-cli), each with the checks that keep a loaded machine from fooling it.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import redis

from zcluster._keys import SLOTS
from zcluster.errors import ZClusterError
from zcluster.testing._local import LocalGroup, LocalServer
from zcluster.testing._replication import replica_problems

__all__ = ["LocalRedisCluster", "find_cli", "held_by_replica"]

_NODE_OPTIONS = ("--cluster-enabled", "yes", "--cluster-node-timeout", "2000", "--cluster-config-file", "nodes.conf")


def find_cli() -> str | None:
    """Path of ``redis-cli`` (or ``valkey-cli``) on PATH, or None: what :meth:`LocalRedisCluster.add_master`
    and :meth:`LocalRedisCluster.reshard` run when asked for the operator's own tool."""
    return shutil.which("redis-cli") or shutil.which("valkey-cli")


def _epochs(nodes: str) -> dict[str, int]:
    """``CLUSTER NODES`` as node id -> config epoch, for the masters (failed, handshake and noaddr ones left out)."""
    rows = [line.split() for line in nodes.splitlines() if line.strip()]
    out = {}
    for r in rows:
        flags = set(r[2].split(","))
        if "master" in flags and not flags & {"fail", "handshake", "noaddr"}:
            out[r[0]] = int(r[6])
    return out


def _saved_claim(nodes_conf: str) -> tuple[int, int] | None:
    """(config epoch, first slot) of the slots a node's saved ``nodes.conf`` says it serves as a master; None
    when it says it serves none (a replica, a master without slots)."""
    for line in nodes_conf.splitlines():
        r = line.split()
        if len(r) > 8 and "myself" in r[2].split(",") and "master" in r[2].split(","):
            spans = [s for s in r[8:] if not s.startswith("[")]  # "[slot->-id]": a migration's, not served
            if spans:
                return int(r[6]), int(spans[0].split("-")[0])
    return None


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

    FAILOVER_WAIT = 180.0
    """``failover_timeout`` for a client that must ride out a failover of this cluster, and the bound of a
    test's wait on one: an outer bound that only a broken cluster reaches. One takes ~4 s on a quiet machine,
    but an election that fails is retried after 4 x ``cluster-node-timeout`` (8 s), and a loaded machine has
    taken over 20 s (the client's default)."""

    def __init__(
        self,
        masters: int = 3,
        *,
        binary: str | None = None,
        timeout: float = 120.0,
        replicas: int = 0,
        aof: bool = False,
    ) -> None:
        super().__init__(binary)
        self._aof = aof
        try:
            for _ in range(masters):
                self._new_server(_NODE_OPTIONS, aof=aof)
            for i in range(masters):
                for _ in range(replicas):
                    self._new_server(_NODE_OPTIONS, aof=aof, replica_of=i)
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

    def wait_ok(self, timeout: float = 120.0) -> None:
        """Wait until every live node agrees and every live replica is online; else :class:`ZClusterError`
        after ``timeout`` seconds (generous: a replica's full sync and the nodes' gossip are slow on a loaded
        machine, and only a broken cluster reaches it). A node that does not answer in time (busy, loading
        its data) is asked again, as one that does not agree yet.

        Live nodes (masters and replicas not killed or stopped) must all say ``cluster_state:ok``, see the
        same slot map covering all 16384 slots, see the same config epoch for every master, no two masters
        alike (Redis settles a collision by bumping one, at its first gossip after they met: a master that
        bumps unheard just before it is killed can leave its replica promoted with the old master's saved
        epoch, and the old master, started again, would win the tie and take its slots back; see
        :meth:`start`), and list each live replica (a node whose own
        ``CLUSTER NODES`` says ``slave``) under the same master; each of those replicas must be online: its
        ``INFO replication`` says ``master_link_status:up``, its master lists it with ``state=online``, and
        ``WAIT`` on its master counts it. A replica whose master was killed therefore holds this up until
        failover has promoted it.
        """
        deadline = time.monotonic() + timeout
        while True:
            live = [s for s in self._nodes() if s.process is not None]
            states, maps, views, epochs, problems = [], [], [], [], []
            for s in live:
                try:  # a node busy on a loaded machine (or still loading its data) is waited for, like the rest
                    with s.client(socket_timeout=5) as c:
                        info = c.execute_command("CLUSTER", "INFO").decode()
                        slots = sorted((r[0], r[1], r[2][1]) for r in c.execute_command("CLUSTER", "SLOTS"))
                        nodes = c.execute_command("CLUSTER", "NODES").decode()
                except redis.RedisError as exc:
                    problems.append(f"node on port {s.port}: {exc.__class__.__name__}: {exc}")
                    continue
                states.append("cluster_state:ok" in info)
                maps.append(slots)
                views.append(_roles(nodes))
                epochs.append(_epochs(nodes))
            if not problems:
                problems = [
                    f"node on port {s.port}: cluster_state not ok" for s, ok in zip(live, states, strict=True) if not ok
                ]
                if any(m != maps[0] for m in maps) or sum(r[1] - r[0] + 1 for r in maps[0]) != SLOTS:
                    problems.append("the nodes' slot maps differ or leave slots unassigned")
                if any(e != epochs[0] for e in epochs) or len(set(epochs[0].values())) < len(epochs[0]):
                    problems.append("the masters' config epochs are not settled (the nodes differ, or two are alike)")
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

    def start(self, i: int) -> None:
        """Start master ``i`` again on its port (after :meth:`kill` or :meth:`stop`).

        Refused (:class:`ZClusterError`, nothing started) when the node's saved ``nodes.conf`` says it serves
        slots that another node serves now (a replica promoted by failover) with a config epoch not above the
        saved one. Started so, the node would take its slots back (a higher epoch wins; a tie goes to the
        lower node id) and its successor would turn replica and resync from it: without persistence it
        comes back empty, so every write acknowledged on that shard before the restart would be lost, by
        Redis Cluster itself. (A failover after :meth:`wait_ok` promotes with an epoch above every saved
        one; the check is there so that the day it does not, a test fails here instead of losing data.)
        Not checked when no running node answers."""
        conf = self.servers[i].directory / "nodes.conf"
        claim = _saved_claim(conf.read_text(errors="replace")) if conf.exists() else None
        if claim is not None:
            self._check_takeback(i, *claim)
        super().start(i)

    def _check_takeback(self, i: int, saved: int, slot: int, timeout: float = 120.0) -> None:
        """Raise when the node serving ``slot`` now is another one whose config epoch is not above ``saved``.
        Nodes that do not answer (busy on a loaded machine) are asked again until ``timeout``."""
        port = self.servers[i].port
        deadline = time.monotonic() + timeout
        while True:
            live = [s for s in self._nodes() if s.process is not None]
            try:
                if not live:
                    return
                with live[0].client(socket_timeout=5) as c:
                    owner = next((r[2] for r in c.execute_command("CLUSTER", "SLOTS") if r[0] <= slot <= r[1]), None)
                if owner is None or int(owner[1]) == port:
                    return  # still its own (no failover): it comes back as their master
                successor = next(s for s in live if s.port == int(owner[1]))
                with successor.client(socket_timeout=5) as c:
                    info = c.execute_command("CLUSTER", "INFO").decode()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        held = int(next(line for line in info.splitlines() if line.startswith("cluster_my_epoch:")).split(":")[1])
        if held <= saved:
            raise ZClusterError(
                f"node on port {port} not started: its nodes.conf claims slot {slot} with config epoch {saved}, "
                f"and port {owner[1]} serves it now with config epoch {held}; started so, it would take its "
                "slots back and its successor would resync from it, losing every write acknowledged on that shard"
            )

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
                    return self._master_at(int(master[1]), f"slot {slot}")
        raise ZClusterError(f"slot {slot} has no owner")

    def _master_at(self, port: int, what: str = "a slot") -> int:
        found = [i for i, s in enumerate(self.servers) if s.port == port]
        if not found:
            raise ZClusterError(f"{what} is owned by port {port}, not one of the masters started as masters")
        return found[0]

    def migrate_slot(self, slot: int, dst: int, *, batch: int = 10, pause: float = 0.0) -> int:
        """Move ``slot`` to server ``dst`` the way redis-cli's resharding does; returns keys moved.

        IMPORTING on the target, MIGRATING on the source, MIGRATE the keys in batches (``pause`` seconds
        between batches, so writers see ASK redirects meanwhile), then SETSLOT NODE on every node.
        """
        if self.slot_owner(slot) == dst:
            return 0
        src = self.open_slot(slot, dst)
        moved = 0
        with self.servers[src].client() as sc:
            while True:
                keys = sc.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
                if not keys:
                    break
                sc.execute_command("MIGRATE", "127.0.0.1", self.servers[dst].port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
                if pause:
                    time.sleep(pause)
        self.close_slot(slot, dst)
        return moved

    def open_slot(self, slot: int, dst: int, *moving: bytes) -> int:
        """Open ``slot``'s migration to server ``dst`` (IMPORTING there, MIGRATING on its owner) and move the
        Redis keys ``moving`` (MIGRATE), as redis-cli's resharding does; returns the owner's index. Left so, it
        is a migration held open, as by a redis-cli that died; :meth:`close_slot` ends it."""
        src = self.slot_owner(slot)
        with self.servers[src].client() as sc, self.servers[dst].client() as dc:
            dc.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(src))
            sc.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(dst))
            if moving:
                sc.execute_command("MIGRATE", "127.0.0.1", self.servers[dst].port, "", 0, 5000, "KEYS", *moving)
        return src

    def close_slot(self, slot: int, dst: int) -> None:
        """End ``slot``'s migration: server ``dst`` owns it now, on every running node (SETSLOT NODE)."""
        owner = self.node_id(dst)
        for s in self.servers:
            if s.process is not None:
                with s.client() as c:
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", owner)

    def add_master(self, *, cli: bool | None = None, timeout: float = 120.0) -> int:
        """Start a new cluster node and join it as a master holding no slot; returns its index in ``servers``.

        Joined as an operator does, with ``redis-cli --cluster add-node <new> <existing>`` (``cli`` None: when
        :func:`find_cli` finds one; True: required), or else with ``CLUSTER MEET`` sent from the new node, which
        is what add-node sends. Returns once every live node lists it as a master and :meth:`wait_ok` passes;
        it gets slots from :meth:`reshard`. Raises :class:`ZClusterError` if redis-cli fails or the nodes do
        not all see it within ``timeout`` seconds.
        """
        seed = next((s for s in self.servers if s.process is not None), None)
        if seed is None:
            raise ZClusterError("no master of the Redis Cluster is running")
        node = self._new_server(_NODE_OPTIONS, aof=self._aof)
        tool = _cli_for(cli)
        if tool is None:
            with node.client() as c:
                c.execute_command("CLUSTER", "MEET", "127.0.0.1", seed.port)
        else:
            _run_cli([tool, "--cluster", "add-node", f"127.0.0.1:{node.port}", f"127.0.0.1:{seed.port}"], timeout)
        deadline = time.monotonic() + timeout
        while True:
            live = [s for s in self._nodes() if s.process is not None]
            missing = []
            for s in live:
                try:
                    with s.client(socket_timeout=5) as c:
                        if _roles(c.execute_command("CLUSTER", "NODES").decode()).get(node.port, -1) is not None:
                            missing.append(s.port)
                except redis.RedisError:  # busy on a loaded machine: asked again
                    missing.append(s.port)
            if not missing:
                break
            if time.monotonic() > deadline:
                raise ZClusterError(f"nodes on ports {missing} do not list the new master on port {node.port}")
            time.sleep(0.05)
        self.wait_ok(max(deadline - time.monotonic(), 1.0))
        return len(self.servers) - 1

    def reshard(self, count: int, dst: int, *, cli: bool | None = None, timeout: float = 600.0) -> int:
        """Move about ``count`` slots (and their keys) to master ``dst`` from the other masters, then
        :meth:`wait_ok`; returns how many slots ``dst`` gained.

        With ``redis-cli --cluster reshard <node> --cluster-from <ids> --cluster-to <id> --cluster-slots
        <count> --cluster-yes`` (``cli`` as in :meth:`add_master`), the masters holding slots as sources; or
        else slot by slot with :meth:`migrate_slot`. Either way each source gives a share proportional to the
        slots it holds, its lowest slots first; redis-cli rounds the largest source's share up and the others
        down (so it may move a slot or two fewer than ``count``; 4096 of 3 x ~5461 is exact), the built-in
        way gives the rounded-off slots to the largest remainders (exactly ``count``). Writers meanwhile meet
        ``MOVED``, ``ASK`` and ``TRYAGAIN``. Raises :class:`ZClusterError` if the sources hold fewer than
        ``count`` slots, or if redis-cli fails (with the end of its output).
        """
        owned = self._slots_by_master()
        had = len(owned.get(dst, []))
        sources = sorted((i for i in owned if i != dst), key=lambda i: -len(owned[i]))
        total = sum(len(owned[i]) for i in sources)
        if count > total:
            raise ZClusterError(f"cannot move {count} slots to port {self.servers[dst].port}: the others hold {total}")
        tool = _cli_for(cli)
        if tool is not None:
            ids = ",".join(self.node_id(i) for i in sources)
            args = ["--cluster-from", ids, "--cluster-to", self.node_id(dst), "--cluster-slots", str(count)]
            _run_cli(
                [tool, "--cluster", "reshard", f"127.0.0.1:{self.servers[dst].port}", *args, "--cluster-yes"], timeout
            )
        else:
            shares = {i: count * len(owned[i]) // total for i in sources}
            by_remainder = sorted(sources, key=lambda i: -(count * len(owned[i]) % total))
            for i in by_remainder[: count - sum(shares.values())]:
                shares[i] += 1
            for i in sources:
                for slot in owned[i][: shares[i]]:
                    self.migrate_slot(slot, dst)
        self.wait_ok()
        return len(self._slots_by_master().get(dst, [])) - had

    def _slots_by_master(self) -> dict[int, list[int]]:
        """Master index -> the slots it serves, ascending (``CLUSTER SLOTS`` of the first live master)."""
        live = next((s for s in self.servers if s.process is not None), None)
        if live is None:
            raise ZClusterError("no master of the Redis Cluster is running")
        owned: dict[int, list[int]] = {}
        with live.client() as c:
            for lo, hi, master, *_ in sorted(c.execute_command("CLUSTER", "SLOTS")):
                owned.setdefault(self._master_at(int(master[1])), []).extend(range(lo, hi + 1))
        return owned


def _cli_for(cli: bool | None) -> str | None:
    """The redis-cli to run (None: the built-in way), as ``cli`` asks: True must find one, False never runs one."""
    if cli is False:
        return None
    tool = find_cli()
    if tool is None and cli:
        raise ZClusterError("redis-cli (or valkey-cli) was asked for and is not on PATH")
    return tool


def _run_cli(args: list[str], timeout: float) -> None:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-10:]
        raise ZClusterError(f"{' '.join(args[:3])} exited with {done.returncode}: " + " | ".join(tail))


def held_by_replica(replica: LocalServer, redis_key: bytes) -> dict[bytes, float]:
    """A Redis Cluster replica's own copy of a sorted set, member -> score (``READONLY`` on one connection:
    the replica answers from its own data instead of redirecting to its master)."""
    with replica.client(single_connection_client=True) as r:
        r.execute_command("READONLY")
        return {bytes(m): float(s) for m, s in r.zrange(redis_key, 0, -1, withscores=True)}
