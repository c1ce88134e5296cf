"""``spark.read.format("zcluster")``: the store's sets as a DataFrame (the batch reader of the ``zcluster``
data source, whose writer is :mod:`zcluster.spark.writer`).

Rows are ``key string, score double, member string``: each key's members, highest score first (ties:
member descending, as :meth:`zcluster.Cluster.select`). With ``tombstones`` = ``true`` the removed members
come too, and a column ``inserted boolean`` tells them apart (false for a tombstone).

Options (names are case-insensitive; any other is refused with a :class:`ConfigError` listing these):

* ``urls`` (comma-separated standalone shard URLs) or ``cluster_url`` (a Redis Cluster seed), ``prefix``
  (default ``zc:``): where the store is, as the writer takes them;
* ``keys``: the keys to read, comma-separated or a JSON list of strings; or ``pattern``: a Redis glob over
  the logical keys (:meth:`zcluster.Cluster.keys`' ``match``). Neither: every key. Not both;
* ``limit``: at most this many rows per key (its highest scores; with ``tombstones``, members and tombstones
  together); default: all of them;
* ``tombstones``: ``true`` to read the removed members too (and keys holding nothing else);
* ``batch``: keys per SCAN step and per read call (default 1000);
* ``numPartitions``: with ``keys``, how many partitions the list is cut into (default: one per shard).

Partitions: a scan (``pattern``, or neither option) has one partition per master (a standalone shard, a
Redis Cluster's master), and each scans only its own master (:meth:`zcluster.Cluster.scan` positions
``"<shard>:<cursor>"``) and reads its keys' members from it. A key list is cut into contiguous parts.

What a read is, and is not:

* Not a snapshot. SCAN's guarantee holds: a key present for the whole read is read; a key created or
  removed during it may or may not be. SCAN may return a key twice: each partition reads a key once.
  Each row is its member's state when its key was read (keys are read in batches, one after another): a
  member written during the read may or may not appear, and two keys may be read at different moments.
* Never silently partial. A shard that fails fails the read, naming it (:class:`PartialScanError` from its
  scan, :class:`PartialReadError` from its keys' reads), after Spark's task retries; so does a Redis
  Cluster whose masters changed (a failover) since the read was planned: its positions name the old masters.
* A pattern matching nothing, or an empty key list, gives an empty DataFrame with the schema.
* Members and keys must be UTF-8 (they become Spark strings): another byte string fails the read (Arrow's
  ``Invalid UTF8 payload``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from zcluster.cluster import Cluster
from zcluster.config import ClusterConfig
from zcluster.errors import ConfigError, PartialScanError
from zcluster.spark.options import config_from_options
from zcluster.types import Blob, Insert, ShardFailure, to_bytes

SCHEMA = "key string, score double, member string"
TOMBSTONES_SCHEMA = SCHEMA + ", inserted boolean"
OPTIONS = ("urls", "cluster_url", "prefix", "keys", "pattern", "limit", "tombstones", "batch", "numpartitions")
"""Every option the reader takes (lowercase: Spark's options are case-insensitive)."""
_ALL = 1 << 62  # "every member" as a select limit: ZREVRANGE key 0 2**62-1


def read_schema(options: dict[str, str]) -> str:
    """The DataFrame schema for these options (the ``inserted`` column with ``tombstones``)."""
    return TOMBSTONES_SCHEMA if _flag(options, "tombstones") else SCHEMA


@dataclass(frozen=True)
class ReadOptions:
    """The reader's options, parsed and checked in the driver."""

    config: ClusterConfig
    keys: tuple[str, ...] | None  # None: scan
    pattern: str | None
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
        return cls(
            config=config_from_options(options),
            keys=_keys(options["keys"]) if "keys" in options else None,
            pattern=options.get("pattern"),
            limit=_count(options, "limit", _ALL),
            tombstones=_flag(options, "tombstones"),
            batch=_count(options, "batch", 1000),
            partitions=_count(options, "numpartitions", 0) or None,
        )


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


def _count(options: dict[str, str], name: str, default: int) -> int:
    text = options.get(name)
    if text is None:
        return default
    if not text.strip().isdigit() or int(text) <= 0:
        raise ConfigError(f"option {name} must be a positive integer, not {text!r}")
    return int(text)


def _flag(options: dict[str, str], name: str) -> bool:
    text = options.get(name, "false").strip().lower()
    if text not in ("true", "false"):
        raise ConfigError(f"option {name} must be 'true' or 'false', not {options[name]!r}")
    return text == "true"


class ShardScan(InputPartition):
    """A scan partition: the keys of master ``name`` (``host:port``)."""

    def __init__(self, name: str) -> None:
        self.name = name


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
        with o.config.open() as cluster:
            shards = cluster.shards
        if o.keys is None:
            return [ShardScan(name) for name in shards]
        keys = list(o.keys)
        parts = max(1, min(len(keys), o.partitions or len(shards)))
        size = max(1, -(-len(keys) // parts))
        return [KeyList(keys[i : i + size]) for i in range(0, len(keys), size)] or [KeyList([])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        o = self.options
        cluster = o.config.shared().view(o.config.prefix, decode=False)  # bytes: Arrow checks UTF-8 itself
        if isinstance(partition, ShardScan):
            batches = _scan(cluster, partition.name, o.pattern, o.tombstones, o.batch)
        else:
            assert isinstance(partition, KeyList)
            keys: list[Blob] = list(partition.keys)
            batches = (keys[i : i + o.batch] for i in range(0, len(keys), o.batch))
        for keys_batch in batches:
            if keys_batch:
                yield _rows(cluster, keys_batch, o.limit, o.tombstones)


def _scan(cluster: Cluster, name: str, pattern: str | None, removed: bool, batch: int) -> Iterator[list[Blob]]:
    """The keys of master ``name`` in batches, each once: its SCAN, by :meth:`Cluster.scan` positions."""
    seen: set[Blob] = set()
    cursor = "0"
    while True:
        index = _index(cluster, name)  # again each step: a Redis Cluster's masters may be listed anew
        keys, position = cluster.scan(f"{index}:{cursor}", batch, include_removed=removed, match=pattern)
        fresh = [k for k in keys if k not in seen]
        seen.update(fresh)
        yield fresh
        if position is None or not position.startswith(f"{index}:"):
            return  # past this master: the next one is another partition's
        cursor = position.partition(":")[2]


def _index(cluster: Cluster, name: str) -> int:
    """Master ``name``'s index in ``cluster``'s masters now; a master no longer one fails the scan (its
    positions would scan another server: the read would be silently partial)."""
    shards = cluster.shards
    if name not in shards:
        gone = LookupError(f"{name} is no longer a master (a failover since the read was planned?)")
        raise PartialScanError([ShardFailure(name, gone, ())])
    return shards.index(name)


def _rows(cluster: Cluster, keys: list[Any], limit: int, tombstones: bool) -> pa.RecordBatch:
    """One Arrow batch: the members of ``keys`` (and their tombstones, with ``tombstones``)."""
    key_col: list[bytes] = []
    scores: list[float] = []
    members: list[Blob] = []
    inserted: list[bool] = []
    if tombstones:
        for key, writes in cluster.records(keys).items():
            top = writes[:limit]
            key_col += [to_bytes(key)] * len(top)
            scores += [w.score for w in top]
            members += [w.member for w in top]
            inserted += [isinstance(w, Insert) for w in top]
    else:
        for key, items in cluster.select(keys, limit=limit).items():
            key_col += [to_bytes(key)] * len(items)
            scores += [t.score for t in items]
            members += [t.member for t in items]
    columns = [_strings(key_col), pa.array(scores, pa.float64()), _strings(members)]
    if tombstones:
        columns.append(pa.array(inserted, pa.bool_()))
    return pa.RecordBatch.from_arrays(columns, schema=TOMBSTONES_ARROW if tombstones else ARROW)


def _strings(values: list[Any]) -> pa.Array:
    """``values`` (bytes) as an Arrow string column (Arrow's ``ArrowInvalid`` for bytes that are not UTF-8)."""
    return pa.array(values, pa.binary()).cast(pa.string())


ARROW = pa.schema([("key", pa.string()), ("score", pa.float64()), ("member", pa.string())])
TOMBSTONES_ARROW = ARROW.append(pa.field("inserted", pa.bool_()))
