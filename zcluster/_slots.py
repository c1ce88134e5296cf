"""A Redis Cluster's keys by hash slot, through reshards and failovers: the scan of a set of slots that
``spark.read.format("zcluster")`` partitions a Redis Cluster by (:mod:`zcluster.spark.reader`).

A SCAN cursor belongs to one node, and a slot moved away from a node after its cursor passed it (or to it
before) is lost to a per-node scan. Here each slot is read by ``CLUSTER GETKEYSINSLOT`` on the node the
slot map names, in a pipeline that ends with that node's ``CLUSTER NODES``: its own view, taken after
the read, says whether the read was the whole slot:

* it owns the slot and is not migrating it: every key of the slot present during the read was read
  (keys leave a node only while it migrates their slot, and a completed migration ends its ownership);
* it is migrating the slot: the keys already moved are on the target, read next (keys move one way,
  so a key is on the source when the source is read, or on the target when the target is read after it);
* the target of such a migration, importing the slot, read after its source: done;
* anything else (it does not own the slot: a reshard or a failover since the map was read; it imports
  the slot but its source was not read): the owner its view names is read next, or the map's after a
  reload when its view names none.

A slot found on two nodes gives each key once. A failed node is followed as every call is
(:func:`zcluster._follow.follow`: the failover is waited for, the pipeline resent to the new owner). A slot
that keeps moving (more than ``MAX_HOPS`` nodes), or a node that fails for good (killed with no replica to
take over, or one that did not within the failover timeout), fails the scan with :class:`PartialScanError`
naming the slot's node: never a silently partial scan.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

from zcluster._keys import KeyLayout
from zcluster._topology import ClusterTopology, Shard
from zcluster._transport import SHARD_ERRORS, Transport
from zcluster.errors import PartialScanError
from zcluster.types import ShardFailure, to_bytes

MAX_HOPS = 8
"""Nodes one slot's read may go through before it fails (each hop is a move seen mid-read)."""
_ALL = (1 << 31) - 1  # GETKEYSINSLOT's count: servers answer with the keys the slot holds, at most this


def glob_regex(pattern: bytes) -> re.Pattern[bytes]:
    """A Redis glob (``*``, ``?``, ``[...]`` with ``^`` and ranges, ``\\`` escapes) as a regex: SCAN MATCH's
    test, for keys that come from ``CLUSTER GETKEYSINSLOT`` (which takes no pattern)."""
    out: list[bytes] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i : i + 1]
        if c == b"*":
            out.append(b".*")
        elif c == b"?":
            out.append(b".")
        elif c == b"\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i : i + 1]))
        elif c == b"[":
            j, body = i + 1, list[bytes]()
            negate = pattern[j : j + 1] == b"^"
            j += negate
            while j < n and pattern[j : j + 1] != b"]":
                if pattern[j : j + 1] == b"\\" and j + 1 < n:
                    j += 1
                    body.append(re.escape(pattern[j : j + 1]))
                elif pattern[j + 1 : j + 2] == b"-" and j + 2 < n and pattern[j + 2 : j + 3] != b"]":
                    lo, hi = sorted((pattern[j : j + 1], pattern[j + 2 : j + 3]))
                    body.append(re.escape(lo) + b"-" + re.escape(hi))
                    j += 2
                else:
                    body.append(re.escape(pattern[j : j + 1]))
                j += 1
            out.append(b"[" + (b"^" if negate else b"") + b"".join(body) + b"]" if body else b"(?!)")
            i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile(b"".join(out), re.DOTALL)


class NodeView:
    """One node's own view of some slots, from its ``CLUSTER NODES`` (also :meth:`zcluster.Cluster.stats`'
    open slots)."""

    def __init__(self, text: str) -> None:
        self.owner: dict[int, str] = {}  # slot -> "host:port" of the master holding it
        self.me = ""
        self.migrating: dict[int, str] = {}  # slot -> node id it migrates to (this node's)
        self.importing: dict[int, str] = {}  # slot -> node id it imports from
        self.address: dict[str, str] = {}  # node id -> "host:port"
        for line in text.splitlines():
            fields = line.split()
            if len(fields) < 8:
                continue
            name = fields[1].split("@")[0]
            self.address[fields[0]] = name
            myself = "myself" in fields[2].split(",")
            if myself:
                self.me = name
            for entry in fields[8:]:
                if entry.startswith("["):  # [slot->-id] or [slot-<-id]: only a node's own line has them
                    text, arrow, peer = entry[1:-1].partition("->-") if "->-" in entry else entry[1:-1].partition("-<-")
                    if myself:
                        (self.migrating if arrow == "->-" else self.importing)[int(text)] = peer
                    continue
                lo, _, hi = entry.partition("-")
                for slot in range(int(lo), int(hi or lo) + 1):
                    self.owner[slot] = name

    def next_node(self, slot: int, after_source: bool) -> tuple[str | None, bool] | None:
        """Where ``slot``'s keys may also be, after this node's were read: None (nowhere: done), or the node
        to read next ("host:port"; None: the map's owner after a reload) and whether it is a migration's
        target read after its source."""
        if self.owner.get(slot) == self.me:
            target = self.migrating.get(slot)
            return None if target is None else (self.address.get(target), True)
        if slot in self.importing:
            return None if after_source else (self.address.get(self.importing[slot]), False)
        return self.owner.get(slot), False


def slot_keys(
    transport: Transport,
    layout: KeyLayout,
    slots: Sequence[int],
    pattern: bytes,
    per_step: int,
) -> Iterator[list[bytes]]:
    """The logical keys whose Redis keys match ``pattern`` (a :meth:`KeyLayout.scan_pattern`) in ``slots``,
    ``per_step`` slots at a time, each key once (see the module). :class:`PartialScanError` for a slot
    that kept moving, or a node that failed (after the transport followed what it could: a failover, a
    redirect), naming the node; the error it failed with is the failure's ``error`` and the cause."""
    topology = transport.topology
    assert isinstance(topology, ClusterTopology)
    wanted = glob_regex(pattern).fullmatch
    for lo in range(0, len(slots), per_step):
        found: dict[bytes, None] = {}
        # slot -> (node to read, read after its migration source, hops so far)
        todo: dict[int, tuple[Shard, bool, int]] = {
            s: (_owner(topology, s), False, 0) for s in slots[lo : lo + per_step]
        }
        while todo:
            by_node: dict[str, list[int]] = {}
            shards: dict[str, Shard] = {}
            for slot, (shard, _, _) in todo.items():
                by_node.setdefault(shard.name, []).append(slot)
                shards[shard.name] = shard
            following: dict[int, tuple[Shard, bool, int]] = {}
            for name, node_slots in by_node.items():
                commands: list[tuple[Any, ...]] = [("CLUSTER", "GETKEYSINSLOT", s, _ALL) for s in node_slots]
                try:
                    replies = transport.commands(shards[name], [*commands, ("CLUSTER", "NODES")])
                except SHARD_ERRORS as error:  # a node that stayed down (no replica took over): name it
                    raise PartialScanError([ShardFailure(name, error, ())]) from error
                for reply in replies:
                    if isinstance(reply, BaseException):
                        raise PartialScanError([ShardFailure(name, reply, ())])
                view = NodeView(to_bytes(replies[-1]).decode())
                for slot, keys in zip(node_slots, replies, strict=False):
                    for raw in keys:
                        rk = to_bytes(raw)
                        if wanted(rk):
                            parts = layout.logical(rk)
                            if parts is not None:
                                found[parts[0]] = None
                    _, after_source, hops = todo[slot]
                    step = view.next_node(slot, after_source)
                    if step is None:
                        continue
                    if hops + 1 >= MAX_HOPS:
                        moving = LookupError(f"hash slot {slot} moved {MAX_HOPS} times during its read")
                        raise PartialScanError([ShardFailure(view.me or name, moving, ())])
                    where, source_read = step
                    if where is None:
                        topology.refresh()
                        shard = _owner(topology, slot)
                    else:
                        host, _, port = where.rpartition(":")
                        shard = topology.redirect(host, int(port))
                    following[slot] = (shard, source_read, hops + 1)
            todo = following
        yield list(found)


def _owner(topology: ClusterTopology, slot: int) -> Shard:
    return topology.shards[topology.shard_of(b"", slot)]
