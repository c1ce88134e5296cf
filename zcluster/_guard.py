"""The layout guard: every shard records the layout of the store it belongs to, and a client whose shard list
disagrees is refused (:class:`zcluster.LayoutMismatchError`) before it sends that shard anything.

Why this module is long: each refusal names both layouts and the way forward, and those messages are most of
its lines; the logic (settle, adopt, mark again, compare) is one class.

Why: a standalone store routes keys by its shard list. A client with another list (a shard added, removed or
reordered, another routing) reads the keys it routes elsewhere as absent and writes them anew, silently; with
them go checkpoints, producer states, fences and dedup entries. Another ``max_size`` trims differently.

The marker: one string key per store (namespace prefix) on each shard, ``{<prefix>}layout``. No key of the
2P-set layout can be it (they all end in ``}+``, ``}-`` or ``}~``, see :mod:`zcluster._keys`), scans of the
store never list it, and on a Redis Cluster it sits in the slot of the prefix and moves with it like any key.
It holds JSON: the layout id (shared by every shard of the layout), the routing, the shard names as listed
when the layout was made, this shard's place, the prefix, ``max_size`` and when it was made. A Redis Cluster
has one marker for the whole store (routing ``"cluster"``, no places: the cluster routes by slot itself).

When the check runs: in redis-py's connect hook (``redis_connect_func``) of every connection the client opens,
after the handshake and before the connection carries any command; never per call. The first connection of a
standalone client reads the markers of every shard and settles the layout id; each later connection (a pool
growing, a reconnect after a restart) reads its own shard's marker and compares it. A Redis Cluster client
checks its one marker at its first connection. A marker is created with a create-if-absent script, so that
concurrent clients agree: it is decided on the reachable shard whose name sorts first, whatever the list's
order, then the others are marked in name order. Two orders of one list (two layouts) race on that one shard:
the loser reads the winner's marker there and is refused (reordered) having marked nothing. A loser on a
later shard (to a list sharing some shards) deletes the markers it made (compare-and-delete) and is refused.

Cases (each a :class:`LayoutMismatchError` naming the shard, both layouts and the way forward): a shard added
or removed (the count differs), the list reordered (a shard's place differs), the same server listed twice
(two places answer with one marker), another routing (``jump``/``roshi``/a Redis Cluster), another
``max_size``, a shard of another store (its layout id is not its peers'). The same URL listed twice is refused
at construction (:class:`zcluster.ConfigError`, by :class:`zcluster._topology.StandaloneTopology`).

Unmarked stores (written before this guard, or new) are adopted on first use with one log line. Adopting must
not itself be the silent loss (a 2-shard store opened first with 3 shards listed): before adopting, up to
:data:`~zcluster._markers.SAMPLE` keys of the prefix are sampled on each listed shard (SCAN MATCH, bounded:
:func:`zcluster._markers.sample`) and each must be one the new list routes to the shard holding it; any
misplaced key refuses adoption. What the sample cannot see: the keys of a shard that is not listed (a 3-shard store
opened with its first 2 shards: with jump routing the 2 listed shards' keys stay in place, so the third's
keys would be lost unseen), keys past the sample on a large shard when only a few are misplaced, and a store
with no keys yet. A shard that restarts empty (its marker gone) among marked peers is marked again with the
layout its peers settled (its keys are sampled first: an empty shard has none); a farm's walker then rebuilds
its data. A shard unreachable while the layout is settled is checked when it can be reached.

Views (:meth:`zcluster.Cluster.view`: the state store's, dedup's namespaces) share their cluster's connections
and so its guard: the shard list is what is checked; their own namespaces carry no marker.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
import uuid
from typing import Any

import redis
from redis.exceptions import AskError, MovedError

from zcluster._keys import KeyLayout
from zcluster._markers import CREATE, DROP, Peer, listing, marker_key, not_cluster_node, parse, run, sample, when
from zcluster._moves import judge
from zcluster._topology import ClusterTopology, Topology
from zcluster.errors import LayoutMismatchError

log = logging.getLogger("zcluster")


def install(topology: Topology, layout: KeyLayout, max_size: int | None, follow: bool = False) -> LayoutGuard:
    """Guard every connection ``topology``'s clients open from now on (their pools must not have connected
    yet: a connection already open is not checked)."""
    guard = LayoutGuard(topology, layout, max_size)
    guard.follow = follow
    for index, shard in enumerate(topology.shards):
        hook(shard.client, functools.partial(guard.connected, index))
    if isinstance(topology, ClusterTopology):
        topology.connect_hook = lambda client: hook(client, functools.partial(guard.connected, -1))
    return guard


def hook(client: redis.Redis, check: Any) -> None:
    """Make ``client``'s new connections run ``check(connection)`` after the handshake."""
    client.connection_pool.connection_kwargs["redis_connect_func"] = check


class LayoutGuard:
    """The layout check of one client (see the module). ``layout_id`` is None until settled."""

    def __init__(self, topology: Topology, layout: KeyLayout, max_size: int | None) -> None:
        self.topology = topology
        self.layout = layout
        self.key = marker_key(layout)
        self.max_size = max_size
        self.cluster = isinstance(topology, ClusterTopology)
        self.routing = "cluster" if self.cluster else str(getattr(topology, "routing", "jump"))
        self.names = [s.name for s in topology.shards]
        self.decider = min(range(len(self.names)), key=self.names.__getitem__) if self.names else 0  # any order
        self.layout_id: str | None = None
        self._candidate: str | None = None  # the id being settled (under the lock): published once all agree
        self._lock = threading.RLock()
        self.follow = False  # a client opened on a layout a migration retired follows it (instead of refused)

    # -- the connect hook -----------------------------------------------------------------------------------

    def connected(self, index: int, conn: Any) -> None:
        """redis-py's connect hook: the handshake, then the check; a refused connection is closed."""
        conn.on_connect()
        if self.cluster and self.layout_id is not None:
            return
        try:
            if self.cluster:
                self._settle_cluster()
            else:
                self._check(index, conn)
        except BaseException:
            conn.disconnect()  # redis-py closes it only for its own errors: never leave it open and unchecked
            raise

    def _check(self, index: int, conn: Any) -> None:
        if self.layout_id is not None:
            stored = self._get(index, conn)
            if stored is not None:
                self._compare(index, stored)
                return
        with self._lock:
            if self.layout_id is None:
                self._settle(index, conn)
                return
            stored = self._get(index, conn)  # another thread may have settled it meanwhile
            if stored is None:
                self._remark(index, conn)
            else:
                self._compare(index, stored)

    # -- standalone shards ----------------------------------------------------------------------------------

    def _settle(self, index: int, conn: Any) -> None:
        """Read every shard's marker; compare, or adopt an unmarked store; set ``layout_id``."""
        peers = {j: conn if j == index else Peer(shard.client) for j, shard in enumerate(self.topology.shards)}
        try:
            self._settle_with(index, peers)
            self.layout_id = self._candidate
        finally:
            self._candidate = None
            for j, peer in peers.items():
                if j != index:
                    peer.close()

    def _settle_with(self, index: int, peers: dict[int, Any]) -> None:
        stored: dict[int, dict[str, Any] | None] = {}
        for j, target in peers.items():
            try:
                stored[j] = self._get(j, target)
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                if j == index:
                    raise
                continue  # checked when it can be reached
        present = {j: m for j, m in stored.items() if m is not None}
        self._check_peers(present)
        for j, m in present.items():
            self._compare_fields(j, m)
        ids = {m["id"] for m in present.values()}
        if ids:
            self._candidate = ids.pop()
            recorded = next(iter(present.values()))["shards"]
            for j in [j for j, m in stored.items() if m is None]:
                if recorded[j] != self.names[j]:
                    raise LayoutMismatchError(
                        f"{self._store()}: place {j} of layout {self._candidate} is {recorded[j]}, but this client "
                        f"lists {self.names[j]} there, which holds no marker of the store: a shard replaced, or a "
                        f"wrong URL. If {recorded[j]} moved with its data, its marker would have moved too: list it "
                        "as it was. If its data is lost and this server replaces it, delete the marker "
                        f"({self.key.decode('utf-8', 'backslashreplace')}) on every shard: the store is then "
                        "adopted again after a check of its keys"
                    )
                self._remark(j, peers[j])
            return
        self._adopt({j: peers[j] for j in stored})

    def _check_peers(self, present: dict[int, dict[str, Any]]) -> None:
        by_id: dict[str, list[int]] = {}
        for j, m in present.items():
            by_id.setdefault(m["id"], []).append(j)
        if len(by_id) > 1:
            groups = "; ".join(
                f"{', '.join(self.names[j] for j in places)} hold layout {lid} "
                f"(made {when(present[places[0]])} for {listing(present[places[0]])})"
                for lid, places in by_id.items()
            )
            raise LayoutMismatchError(
                f"{self._store()}: the listed shards belong to different stores: {groups}. A shard of another "
                "store is listed (same prefix, another deployment): check the URLs; each store keeps its own shards"
            )
        seen: dict[int, int] = {}
        for j, m in present.items():
            k = int(m.get("index", -1))
            if k < 0:
                continue
            if k in seen:
                raise LayoutMismatchError(
                    f"{self._store()}: {self.names[seen[k]]} (place {seen[k]}) and {self.names[j]} (place {j}) "
                    f"answer with the same marker (place {k} of {listing(m)}): the same server is listed twice "
                    "(under two names?); list each shard once, in the original order"
                )
            seen[k] = j

    def _adopt(self, targets: dict[int, Any]) -> None:
        shards, reachable = self.topology.shards, list(targets)
        sampled = 0
        for j, target in targets.items():
            self._not_cluster_node(j, target)
            sampled += self._sample(j, target)
        order = sorted(reachable, key=self.names.__getitem__)  # the decision, whatever the list's order
        value = self._marker(uuid.uuid4().hex, order[0])
        first = self._create(order[0], targets[order[0]], value)
        self._compare_fields(order[0], first)  # a loser of another order is refused here, having marked nothing
        self._candidate = layout_id = first["id"]
        made = [(order[0], value)] if first == json.loads(value) else []
        try:
            for j in order[1:]:
                value = self._marker(layout_id, j)
                stored = self._create(j, targets[j], value)
                if stored == json.loads(value):
                    made.append((j, value))
                self._compare(j, stored)
        except LayoutMismatchError:
            self._drop(targets, made)
            raise
        what = (
            f"adopted the store {self._prefix()} written before layout markers ({sampled} key(s) sampled, each "
            "on the shard this list routes it to)"
            if sampled
            else f"marked the new store {self._prefix()}"
        )
        log.log(
            logging.WARNING if sampled else logging.INFO,
            "layout guard: %s: layout %s, routing %s, %d shard(s) [%s], max_size=%s%s",
            what,
            self._current(),
            self.routing,
            len(self.names),
            ", ".join(self.names),
            self.max_size,
            "" if len(reachable) == len(shards) else f" ({len(shards) - len(reachable)} unreachable: marked later)",
        )

    def _drop(self, targets: dict[int, Any], made: list[tuple[int, str]]) -> None:
        """Delete the markers this adoption made (each only while it holds this client's value): it lost."""
        for j, value in made:
            try:
                run(targets[j], "EVAL", DROP, 1, self.key, value)
            except (redis.RedisError, OSError) as exc:
                what = "kept a marker of the store %s this client made, then lost (%s): see `zcluster markers`"
                log.warning("layout guard: %s " + what, self.names[j], self._prefix(), exc)

    def _remark(self, j: int, target: Any) -> None:
        """Shard ``j`` lost its marker (restarted empty, or flushed) while its peers keep the layout: mark it
        again with the layout id, after checking that the keys it holds belong there."""
        layout_id = self._current()
        self._not_cluster_node(j, target)
        sampled = self._sample(j, target)
        d = self.decider
        if j != d:  # through the deciding shard, as an adoption goes: concurrent clients end on one id
            first = self._on_peer(d, lambda peer: self._create(d, peer, self._marker(layout_id, d)))
            if first is not None and first["id"] != layout_id:
                self._compare(d, first)  # follows it when it is this very layout marked again by another client
                layout_id = self._current()
        self._compare(j, self._create(j, target, self._marker(layout_id, j)))
        log.warning(
            "layout guard: %s had no marker of the store %s (restarted empty or flushed? %d key(s) sampled, all in "
            "place): marked again as place %d of layout %s",
            self.names[j],
            self._prefix(),
            sampled,
            j,
            self._current(),  # the id it holds now: another client's, when it marked the store again first
        )

    def _sample(self, j: int, target: Any) -> int:
        """How many keys of the prefix were sampled on shard ``j``; raises if one is not routed to ``j``."""
        return sample(self.layout, self.topology.shard_of, self.names, j, target, self._store())

    def _not_cluster_node(self, j: int, target: Any) -> None:
        not_cluster_node(self.names[j], target)

    # -- a Redis Cluster ------------------------------------------------------------------------------------

    def _settle_cluster(self) -> None:
        """Create-or-read the one marker of the store on the node owning its slot, following redirects."""
        with self._lock:
            if self.layout_id is not None:
                return
            topology = self.topology
            slot = self.layout.slot(b"")
            shard = topology.shards[topology.shard_of(b"", slot)]
            value = self._marker(uuid.uuid4().hex, None)
            asking = False
            for _ in range(5):
                peer = Peer(shard.client)
                try:
                    if asking:
                        run(peer, "ASKING")
                    reply = run(peer, "EVAL", CREATE, 1, self.key, value)
                    break
                except (MovedError, AskError) as exc:  # the map is stale: the transport reloads it later
                    shard, asking = topology.redirect(exc.host, exc.port), isinstance(exc, AskError)
                finally:
                    peer.close()
            else:
                raise redis.ConnectionError(f"layout guard: the marker of {self._prefix()} kept moving")
            stored = parse(shard.name, reply)
            judge(stored, self.names, False, lambda: None)
            self._compare_fields(-1, stored, shard.name)
            self.layout_id = stored["id"]

    # -- comparing ------------------------------------------------------------------------------------------

    def _compare(self, j: int, stored: dict[str, Any]) -> None:
        k = stored.get("index")
        layout_id = self._current()
        same = stored["id"] == layout_id and len(stored.get("shards", ())) == len(self.names)
        if same and isinstance(k, int) and k != j and 0 <= k < len(self.names):
            raise LayoutMismatchError(
                f"{self._store()}: {self.names[j]} (place {j}) answers with the marker of place {k} "
                f"({self.names[k]}): the same server is listed twice (under two names?) or the list was "
                "reordered; list each shard once, in the original order"
            )
        self._compare_fields(j, stored)
        if stored["id"] != layout_id and not self._marked_again(j, stored):
            raise LayoutMismatchError(
                f"{self._store()}: {self.names[j]} (place {j}) belongs to another store under the same prefix "
                f"(layout {stored['id']}, made {when(stored)} for {listing(stored)}), while its peers hold layout "
                f"{layout_id}: a shard of another store is listed; check the URLs"
            )

    def _marked_again(self, j: int, stored: dict[str, Any]) -> bool:
        """Whether shard ``j``'s marker, of another id but this very layout (fields compared already), is the
        deciding shard's too: migrations moved the store away and back (``from`` names the last), or every
        shard lost its marker and another client marked it again. Then this client follows it (logged)."""
        d = self.decider
        first = stored if j == d or self.cluster else self._on_peer(d, lambda peer: self._get(d, peer))
        if first is None or first["id"] != stored["id"]:
            return False
        with self._lock:
            before = self._current()
            if before == stored["id"]:
                return True  # another connection of this client followed it already (and said so)
            if self._candidate is not None:
                self._candidate = stored["id"]
            else:
                self.layout_id = stored["id"]
        origin = stored.get("from")
        if isinstance(origin, dict):  # nothing was lost: the data came back with the layout
            log.info(
                "layout guard: the store %s came back onto these shards: migration %s moved it here from %s as "
                "layout %s; this client held layout %s, an earlier layout of the same shards, routing and "
                "max_size: it follows it",
                self._prefix(),
                origin.get("migration"),
                listing(origin),
                stored["id"],
                before,
            )
            return True
        log.warning(
            "layout guard: the store %s was marked again as layout %s by another client (no shard held its marker "
            "any more: flushed, restarted empty, or reset by an operator); this client held layout %s with the "
            "same shards, routing and max_size: it follows it",
            self._prefix(),
            stored["id"],
            before,
        )
        return True

    def _on_peer(self, j: int, call: Any) -> Any:
        """``call(peer)`` on a guard connection of its own to shard ``j``; None when ``j`` cannot be reached."""
        peer = Peer(self.topology.shards[j].client)
        try:
            return call(peer)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return None
        finally:
            peer.close()

    def _compare_fields(self, j: int, stored: dict[str, Any], name: str | None = None) -> None:
        """Raise unless ``stored`` (shard ``j``'s marker) agrees with this client on everything but the id."""
        where = f"{self._prefix()} on {name or self.names[j]}"
        routing = stored.get("routing")
        if routing != self.routing:
            mine = "a Redis Cluster" if self.cluster else f"standalone shards routed by {self.routing!r}"
            theirs = "a Redis Cluster" if routing == "cluster" else f"standalone shards routed by {routing!r}"
            how = (
                "a redis+cluster:// seed URL (Cluster.from_cluster_url)"
                if routing == "cluster"
                else f"its shard URLs ({listing(stored)}) and routing={routing!r}"
            )
            raise LayoutMismatchError(
                f"the store {where} was laid out for {theirs}; this client uses {mine}. Open it with {how}"
            )
        if stored.get("max_size") != self.max_size:
            raise LayoutMismatchError(
                f"the store {where} was laid out with max_size={stored.get('max_size')}; this client has "
                f"max_size={self.max_size}: another bound would trim its sets differently. Open it with "
                f"max_size={stored.get('max_size')}"
            )
        if self.cluster:
            return
        count, place = len(stored["shards"]), int(stored["index"])
        if count != len(self.names):
            change = "a shard was added" if len(self.names) > count else "a shard was removed"
            verb = "grow" if len(self.names) > count else "shrink"
            raise LayoutMismatchError(
                f"the store {where} was laid out for {count} shard(s) [{', '.join(stored['shards'])}]; this client "
                f"lists {len(self.names)} [{', '.join(self.names)}]: {change}. The keys the new list routes "
                "elsewhere would read as absent. Open it with the original list, in its order; to "
                f"{verb} the store, migrate it online first (zcluster migrate, zcluster.migration.migrate)"
            )
        if place != j:
            raise LayoutMismatchError(
                f"the store {where}: this shard holds place {place} of the layout [{', '.join(stored['shards'])}], "
                f"but this client lists it at place {j} of [{', '.join(self.names)}]: the list was reordered. "
                "List the shards in the original order"
            )

    # -- plumbing -------------------------------------------------------------------------------------------

    def _current(self) -> str:
        """The layout id being settled, else the settled one."""
        layout_id = self._candidate or self.layout_id
        assert layout_id is not None
        return layout_id

    def _marker(self, layout_id: str, index: int | None) -> str:
        fields: dict[str, Any] = {"id": layout_id, "routing": self.routing}
        if index is not None:
            fields |= {"shards": self.names, "index": index}
        fields |= {"prefix": self._prefix(), "max_size": self.max_size, "created": round(time.time(), 3)}
        return json.dumps(fields)

    def _get(self, j: int, target: Any) -> dict[str, Any] | None:
        """Shard ``j``'s marker, judged for a migration first (see :mod:`zcluster._moves`: it may wait out a
        cut-over, or raise because the store moved)."""
        stored = self._read(j, target)
        if stored is None:
            return None
        return self._judge(j, target, stored)

    def _judge(self, j: int, target: Any, stored: dict[str, Any]) -> dict[str, Any]:
        settled = self.follow or self.layout_id is not None  # a long-lived client follows a move; a new one is refused
        return judge(stored, self.names, settled, lambda: self._read(j, target)) or stored

    def recheck(self, j: int) -> bool:
        """After a lost connection to shard ``j``: whether a migration of the store is under way (the mover
        closes every connection at its cut-over, so the call is sent again: it is idempotent). Raises
        :class:`zcluster._moves.StoreMoved` when the store moved meanwhile."""
        if self.cluster:
            return False
        try:
            stored = self._on_peer(j, lambda peer: self._get(j, peer))
        except LayoutMismatchError:
            return False  # the call's own connection reports it
        return stored is not None and "move" in stored

    def _read(self, j: int, target: Any) -> dict[str, Any] | None:
        try:
            raw = run(target, "GET", self.key)
        except (MovedError, AskError):
            raise LayoutMismatchError(
                f"{self.names[j]} answered as a node of a Redis Cluster, listed as a standalone shard: open the "
                "store with a redis+cluster:// seed URL (Cluster.from_cluster_url)"
            ) from None
        return None if raw is None else parse(self.names[j], raw)

    def _create(self, j: int, target: Any, value: str) -> dict[str, Any]:
        try:
            stored = parse(self.names[j], run(target, "EVAL", CREATE, 1, self.key, value))
            return self._judge(j, target, stored)
        except (MovedError, AskError):
            raise
        except redis.ResponseError as exc:  # a server refusing writes (NOREPLICAS, READONLY, OOM) can still be read
            log.warning(
                "layout guard: %s refused the marker of the store %s (%s): checked by the sample of its keys only; "
                "marked by a later connection once it accepts writes",
                self.names[j],
                self._prefix(),
                exc,
            )
            return parse(self.names[j], value)

    def _prefix(self) -> str:
        return repr(self.layout.prefix.decode("utf-8", "backslashreplace"))

    def _store(self) -> str:
        return f"the store {self._prefix()}"
