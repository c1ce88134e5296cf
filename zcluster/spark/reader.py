"""``spark.read.format("zcluster")``: the store as a DataFrame (the batch reader of the ``zcluster`` data
source, whose writer is :mod:`zcluster.spark.writer`).

What is read, by the ``kind`` option (the schemas and orders are :mod:`zcluster.spark.rows`'):

* ``set`` (the default): 2P-sets, rows ``key string, score double, member string``, each key's members
  highest score first (ties: member descending, as :meth:`zcluster.Cluster.select`). With ``tombstones`` =
  ``true`` the removed members come too, and a column ``inserted boolean`` tells them apart (false for a
  tombstone);
* ``totals`` (leaderboards: sums of :class:`zcluster.Incr`), ``counts`` (counters of :class:`zcluster.Count`),
  ``aggregates`` (both): rows ``key string, kind string, member string, total double, count bigint``, the
  kind ``"totals"`` or ``"counts"`` in ``kind``, a member's total in ``total`` or a field's count in
  ``count`` (the other null), highest first.

A key of another kind than the one asked (a leaderboard met by a ``set`` read, a 2P-set by a ``counts``
read, ...) fails the read with :class:`KeyKindError` naming the key and its server. A key holding
nothing gives no rows.

Options (names are case-insensitive; any other is refused with a :class:`ConfigError` listing these):

* where the store is and how it is laid out, as the writer takes them (one parser,
  :func:`zcluster.spark.options.config_from_options`): ``urls`` (comma-separated standalone shard URLs),
  ``cluster_url`` (a Redis Cluster seed) or ``replicas`` (a farm: a JSON list, one replica each, in any form
  :func:`zcluster.connect` takes) with ``read``, the farm's read strategy (``one``, ``all``, ``first-linger``,
  ``var``; default ``all``); ``prefix`` (default ``zc:``), ``max_size`` and ``routing`` (``jump`` or
  ``roshi``), as the store was written (the layout guard refuses a read with another ``max_size`` or
  routing); with ``cluster_url``, ``failover_timeout`` (seconds a read waits for a dead master's replica to
  take over, default 20);
* ``keys``: the keys to read, comma-separated or a JSON list of strings; or ``pattern``: a Redis glob over
  the logical keys (:meth:`zcluster.Cluster.keys`' ``match``). Neither: every key. Not both;
* ``kind``: ``set``, ``totals``, ``counts`` or ``aggregates`` (above);
* ``limit``: at most this many rows per key (its highest; with ``tombstones``, members and tombstones
  together); default: all of them. Sets and totals read only these from the server; counters and
  ``aggregates`` are read whole, then cut;
* ``tombstones``: ``true`` to read a set's removed members too (and keys holding nothing else);
* ``batch``: keys per read call (default 1000; a Redis Cluster's scan takes ``batch // 16`` slots a step);
* ``numPartitions``: with ``keys``, how many partitions the list is cut into (default: one per shard); on
  a Redis Cluster without ``keys``, how many slot ranges the 16384 slots are cut into (default: one per
  master, its slots when the read was planned). At most :data:`MAX_PARTITIONS` (1024): each partition is
  a Spark task, and thousands of small tasks cost more than they spread.

``limit``, ``batch`` and ``numPartitions`` are integers from 1 (``limit`` and ``batch`` up to 2**62); any
other value (``"²"``, ``99999999999999999999999``, ``0``) fails the planning with a :class:`ConfigError`
naming the option and the value.

Partitions:

* standalone shards: one per shard, scanning it with SCAN (:meth:`zcluster.Cluster.scan` positions);
* a Redis Cluster: one per set of hash slots, read slot by slot wherever each slot is at read time
  (:mod:`zcluster._slots`: ``CLUSTER GETKEYSINSLOT`` on the owner, checked against the node's own view after
  the read, following a migration to its target and a failover to the promoted replica). A reshard or a
  failover during the read neither fails it nor loses or repeats a key: partitions own disjoint slots,
  and a key met twice in a slot (on a migration's source and target) is read once;
* a farm: one partition scanning every replica (:meth:`zcluster.farm.Farm.keys`: each key once, from the
  first replica that holds it), the rows read under the read strategy (``select``, ``top``, ``counters``:
  ``all`` merges every replica's answer, so a replica behind the others does not hide members; ``one``
  reads one replica). ``tombstones`` and ``aggregates`` are not offered on a farm;
* a key list: contiguous parts of it.

What a read is, and is not:

* Not a snapshot. A key present for the whole read is read, exactly once; a key created or removed
  during it may or may not be. Each row is its member's state when its key was read (keys are read in
  batches, one after another): a member written during the read may or may not appear, and two keys may
  be read at different moments.
* Never silently partial. A shard that fails fails the read, naming it (:class:`PartialScanError` from its
  scan, :class:`PartialReadError` from its keys' reads), after Spark's task retries; so does a Redis
  Cluster slot that kept moving during its read (:data:`zcluster._slots.MAX_HOPS`).
* A pattern matching nothing, or an empty key list, gives an empty DataFrame with the schema.
* Members and keys must be UTF-8 (they become Spark strings): another byte string fails the read with
  :class:`zcluster.NotUtf8Error` naming the key, the member and the server.
* A store that a migration moved to another layout is followed: a key list's reads go on against the new
  layout; a scan (its positions meaningless there) fails with :class:`zcluster.LayoutMismatchError`
  saying so (Spark's task retry scans again), never with an internal error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from zcluster._following import following, scanning
from zcluster._keys import SLOTS
from zcluster._slots import slot_keys
from zcluster._topology import ClusterTopology
from zcluster.cluster import Cluster
from zcluster.config import StoreConfig
from zcluster.errors import ConfigError, PartialScanError
from zcluster.farm import Farm
from zcluster.farm.config import FarmConfig
from zcluster.spark.options import STORE_OPTIONS, config_from_options
from zcluster.spark.rows import KINDS, cluster_rows, farm_rows, spark_schema
from zcluster.types import Blob, ShardFailure, to_bytes

OPTIONS = (*STORE_OPTIONS, *("keys", "pattern", "kind", "limit", "tombstones", "batch", "numpartitions"))
"""Every option the reader takes (lowercase: Spark's options are case-insensitive)."""
_ALL = 1 << 62  # "every member" as a limit: ZREVRANGE key 0 2**62-1
MAX_PARTITIONS = 1024
"""The most ``numPartitions`` a read takes: each partition is a Spark task with its own connections and
start-up, so more tasks than this cost more than they spread (16,384 one-slot tasks of a Redis Cluster read
took 493 s where 3 took 4.6 s)."""


def read_schema(options: dict[str, str]) -> str:
    """The DataFrame schema for these options (by ``kind``; the ``inserted`` column with ``tombstones``)."""
    return spark_schema(_kind(options), _flag(options, "tombstones"))


@dataclass(frozen=True)
class ReadOptions:
    """The reader's options, parsed and checked in the driver."""

    config: StoreConfig
    keys: tuple[str, ...] | None  # None: scan
    pattern: str | None
    kind: str
    limit: int
    tombstones: bool
    batch: int
    partitions: int | None

    @classmethod
    def parse(cls, options: dict[str, str]) -> ReadOptions:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ConfigError(
                f"the zcluster data source (read) does not know option(s) {', '.join(unknown)}; "
                f"known: {', '.join(OPTIONS)}"
            )
        if "keys" in options and "pattern" in options:
            raise ConfigError("give the zcluster data source 'keys' or 'pattern', not both")
        kind, tombstones = _kind(options), _flag(options, "tombstones")
        if tombstones and kind != "set":
            raise ConfigError(f"option tombstones is for kind 'set' (2P-sets), not {kind!r}")
        config = config_from_options(options)
        if isinstance(config, FarmConfig) and (tombstones or kind == "aggregates"):
            raise ConfigError("a farm (option replicas) is read with kind set, totals or counts, without tombstones")
        return cls(
            config=config,
            keys=_keys(options["keys"]) if "keys" in options else None,
            pattern=options.get("pattern"),
            kind=kind,
            limit=_count(options, "limit", _ALL),
            tombstones=tombstones,
            batch=_count(options, "batch", 1000),
            partitions=_count(options, "numpartitions", 0, MAX_PARTITIONS) or None,
        )


def _kind(options: dict[str, str]) -> str:
    kind = options.get("kind", "set").strip().lower()
    if kind not in KINDS:
        raise ConfigError(f"option kind must be one of {', '.join(KINDS)}, not {options['kind']!r}")
    return kind


def _keys(text: str) -> tuple[str, ...]:
    """A comma-separated list or a JSON list of strings, each key once, in order."""
    if text.lstrip().startswith("["):
        try:
            keys = json.loads(text)
        except ValueError as error:
            raise ConfigError(f"option keys: not a JSON list ({error})") from None
        if not all(isinstance(k, str) for k in keys):
            raise ConfigError("option keys: a JSON list of strings is needed")
    else:
        keys = [k.strip() for k in text.split(",") if k.strip()]
    return tuple(dict.fromkeys(keys))


def _count(options: dict[str, str], name: str, default: int, most: int = _ALL) -> int:
    """A positive integer option of at most ``most``, in ASCII digits (``str.isdigit`` takes ``"²"``, which
    ``int`` refuses); checked in the driver, so a bad value fails the planning, not the tasks."""
    text = options.get(name)
    if text is None:
        return default
    digits = text.strip()
    # 19 digits bound int()'s work (and its refusal of over 4300 digits) before the range check.
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 19 and 0 < int(digits) <= most):
        raise ConfigError(f"option {name} must be an integer from 1 to {most}, not {text!r}")
    return int(digits)


def _flag(options: dict[str, str], name: str) -> bool:
    text = options.get(name, "false").strip().lower()
    if text not in ("true", "false"):
        raise ConfigError(f"option {name} must be 'true' or 'false', not {options[name]!r}")
    return text == "true"


class ShardScan(InputPartition):
    """A scan partition of standalone shards: the keys of shard ``name`` (``host:port``)."""

    def __init__(self, name: str) -> None:
        self.name = name


class SlotScan(InputPartition):
    """A scan partition of a Redis Cluster: the keys of these hash slots, wherever they are."""

    def __init__(self, slots: list[int]) -> None:
        self.slots = slots


class FarmScan(InputPartition):
    """A farm's scan: every replica's keys, each once."""

    def __init__(self) -> None:
        self.name = "farm"


class KeyList(InputPartition):
    """A part of the ``keys`` option."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys


class TupleReader(DataSourceReader):
    """Batch reader: ``spark.read.format("zcluster")`` (see the module docstring)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = ReadOptions.parse(options)

    def partitions(self) -> list[InputPartition]:
        o = self.options
        store: Cluster | Farm = o.config.open()  # type: ignore[assignment]  # StoreConfig opens one of these
        try:
            if isinstance(store, Farm):
                shards = store.clusters[0].shards
                scans: list[InputPartition] = [FarmScan()]
            else:
                assert isinstance(store, Cluster)
                shards = store.shards
                scans = _scans(store, o.partitions)
        finally:
            store.close()
        if o.keys is None:
            return scans
        keys = list(o.keys)
        parts = max(1, min(len(keys), o.partitions or len(shards)))
        size = max(1, -(-len(keys) // parts))
        return [KeyList(keys[i : i + size]) for i in range(0, len(keys), size)] or [KeyList([])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        o = self.options
        shared = o.config.shared()
        store: Cluster | Farm = shared.view(shared.prefix, decode=False)  # type: ignore[assignment]  # bytes: Arrow checks UTF-8
        batches: Iterator[list[Any]]
        if isinstance(partition, KeyList):
            keys: list[Blob] = [to_bytes(k) for k in partition.keys]
            batches = (keys[i : i + o.batch] for i in range(0, len(keys), o.batch))
        elif isinstance(store, Farm):
            batches = store.keys(o.batch, match=o.pattern)
        elif isinstance(partition, SlotScan):
            batches = _slot_scan(store, partition.slots, o)
        else:
            assert isinstance(partition, ShardScan)
            batches = _scan(store, partition.name, o.pattern, o.tombstones, o.batch)
        for keys_batch in batches:
            if keys_batch:
                if isinstance(store, Farm):
                    yield farm_rows(store, keys_batch, o.kind, o.limit)
                else:
                    yield _cluster_rows(store, keys_batch, o.kind, o.limit, o.tombstones)


# The rows and slot scans read through the store's private parts (its transport), under the Cluster's own
# call wrappers: a store whose migration cut over is followed (rows read again on its new layout; a scan
# raises LayoutMismatchError saying so), never an internal StoreMoved.
_cluster_rows = following(cluster_rows)


@scanning
def _slot_scan(cluster: Cluster, slots: list[int], o: ReadOptions) -> Iterator[list[bytes]]:
    pattern = cluster._layout.scan_pattern(_match(o.pattern), o.tombstones)
    return slot_keys(cluster._transport, cluster._layout, slots, pattern, max(1, o.batch // 16))


def _match(pattern: str | None) -> bytes | None:
    return None if pattern is None else to_bytes(pattern)


def _scans(cluster: Cluster, partitions: int | None) -> list[InputPartition]:
    """The scan partitions of a Cluster: one per standalone shard; on a Redis Cluster, each master's slots
    (or ``partitions`` contiguous slot ranges)."""
    topology = cluster._transport.topology
    if not isinstance(topology, ClusterTopology):
        return [ShardScan(name) for name in cluster.shards]
    if partitions:
        size = -(-SLOTS // partitions)
        return [SlotScan(list(range(lo, min(SLOTS, lo + size)))) for lo in range(0, SLOTS, size)]
    return [SlotScan(slots) for slots in topology.slots_by_master().values()]


def _scan(cluster: Cluster, name: str, pattern: str | None, removed: bool, batch: int) -> Iterator[list[Blob]]:
    """The keys of standalone shard ``name`` in batches, each once: its SCAN, by :meth:`Cluster.scan`
    positions."""
    seen: set[Blob] = set()
    cursor = "0"
    while True:
        index = _index(cluster, name)
        keys, position = cluster.scan(f"{index}:{cursor}", batch, include_removed=removed, match=pattern)
        fresh = [k for k in keys if k not in seen]
        seen.update(fresh)
        yield fresh
        if position is None or not position.startswith(f"{index}:"):
            return  # past this shard: the next one is another partition's
        cursor = position.partition(":")[2]


def _index(cluster: Cluster, name: str) -> int:
    """Shard ``name``'s index in ``cluster``'s shards now; a shard no longer listed (the store moved to
    another layout) fails the scan: its positions would scan another server."""
    shards = cluster.shards
    if name not in shards:
        gone = LookupError(f"{name} is no longer one of the store's shards (the store moved?)")
        raise PartialScanError([ShardFailure(name, gone, ())])
    return shards.index(name)
