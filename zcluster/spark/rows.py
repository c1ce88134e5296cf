"""The rows of ``spark.read.format("zcluster")``: a batch of keys read into one Arrow batch, by kind (see
:mod:`zcluster.spark.reader` for the options and what a read guarantees).

* ``set`` (2P-sets): ``key, score, member`` (and ``inserted`` with tombstones), highest score first;
* ``totals`` (sums of :class:`zcluster.Incr`, leaderboards), ``counts`` (counters of :class:`zcluster.Count`),
  ``aggregates`` (either): ``key, kind, member, total, count``, ``kind`` ``"totals"`` or ``"counts"``, the
  total of a sums key's member in ``total`` (``count`` null), a counter's field in ``member`` and its
  count in ``count`` (``total`` null); highest first (ties: member descending).

A key of another kind than the one asked fails the read with :class:`KeyKindError` naming it; a key that
holds nothing (never written, or expired) gives no rows, whatever the kind asked.

On a :class:`zcluster.Cluster` each batch is one pipeline per shard (``ZREVRANGE ... WITHSCORES`` and the
``TYPE`` of the fences key that tells a sums key apart, or ``HGETALL``, its fence fields dropped), the replies
put into Arrow columns directly (raw replies of streamed pipelines, no redis-py callbacks: that client work was
most of a read's time). On a :class:`zcluster.farm.Farm` the rows come from its reads under its read strategy
(``select``, ``top``, ``counters``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from zcluster._aggregate_keys import KIND_NAMES, counters_of, whole_keys_of
from zcluster._transport import read
from zcluster.cluster import Cluster
from zcluster.errors import KeyKindError, NotUtf8Error, PartialReadError
from zcluster.farm import Farm
from zcluster.types import ShardFailure

KINDS = ("set", "totals", "counts", "aggregates")
"""The ``kind`` option's values."""
SET_ARROW = pa.schema([("key", pa.string()), ("score", pa.float64()), ("member", pa.string())])
TOMBSTONES_ARROW = SET_ARROW.append(pa.field("inserted", pa.bool_()))
AGGREGATES_ARROW = pa.schema(
    [
        ("key", pa.string()),
        ("kind", pa.string()),
        ("member", pa.string()),
        ("total", pa.float64()),
        ("count", pa.int64()),
    ]
)
_WANTED = {
    "set": "a 2P-set",
    "totals": KIND_NAMES["s"],
    "counts": KIND_NAMES["c"],
    "aggregates": "an aggregate key",
}
_NAMES = {"2": "a 2P-set", **KIND_NAMES}


def arrow_schema(kind: str, tombstones: bool) -> pa.Schema:
    """The Arrow schema of a read of ``kind`` (with the ``inserted`` column for a set's tombstones)."""
    if kind == "set":
        return TOMBSTONES_ARROW if tombstones else SET_ARROW
    return AGGREGATES_ARROW


def spark_schema(kind: str, tombstones: bool) -> str:
    """The DataFrame schema of a read of ``kind``, as Spark's DDL."""
    names = {pa.string(): "string", pa.float64(): "double", pa.int64(): "bigint", pa.bool_(): "boolean"}
    return ", ".join(f"{f.name} {names[f.type]}" for f in arrow_schema(kind, tombstones))


class Columns:
    """Rows gathered column by column, then one Arrow batch."""

    def __init__(self, kind: str, tombstones: bool) -> None:
        self.schema = arrow_schema(kind, tombstones)
        self.columns: list[list[Any]] = [[] for _ in self.schema]
        self._pairs: list[Any] = []  # a set's rows but their keys, transposed once in batch()

    def pairs(self, key: Any, pairs: list[Any]) -> None:
        """A set's ``pairs`` ((member, score) or, with tombstones, (member, score, inserted)), highest first."""
        self.columns[0] += [key] * len(pairs)
        self._pairs += pairs

    def batch(self, where: Callable[[Any], str]) -> pa.RecordBatch:
        """The Arrow batch; a key or member that is not UTF-8 raises :class:`NotUtf8Error` naming it and
        its server, ``where(key)``."""
        rows = self._pairs
        if rows:  # one pass per column over the batch (zip(*rows) is ten times slower: one iterator a row)
            self.columns[1:3] = [[r[1] for r in rows], [r[0] for r in rows]]
            if len(self.columns) == 4:
                self.columns[3] = [r[2] for r in rows]
        try:
            arrays = [
                pa.array(col, pa.binary()).cast(pa.string()) if f.type == pa.string() else pa.array(col, f.type)
                for col, f in zip(self.columns, self.schema, strict=True)
            ]
        except pa.ArrowInvalid:
            self._not_utf8(where)
            raise  # not a UTF-8 failure
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _not_utf8(self, where: Callable[[Any], str]) -> None:
        """Raise :class:`NotUtf8Error` for the first key or member of the batch that is not UTF-8 (Arrow's
        own error names neither), if there is one."""
        keys = self.columns[0]
        for i, column in enumerate(self.columns):
            if self.schema[i].type != pa.string():
                continue
            for row, value in enumerate(column):
                if isinstance(value, bytes):
                    try:
                        value.decode()
                    except UnicodeDecodeError:
                        key = keys[row]
                        raise NotUtf8Error(key, None if i == 0 else value, where(key)) from None


def cluster_rows(cluster: Cluster, keys: list[Any], kind: str, limit: int, tombstones: bool) -> pa.RecordBatch:
    """One Arrow batch: the rows of ``keys`` (bytes) in ``cluster`` (see the module)."""
    layout = cluster._layout
    last = limit - 1
    build: Callable[[bytes, int], list[tuple[Any, ...]]]
    if kind == "set" and tombstones:  # ZREVRANGE of an aggregate's fences (a hash) fails: WRONGTYPE
        build = lambda kb, _: [  # noqa: E731
            ("ZREVRANGE", layout.adds(kb), 0, last, "WITHSCORES"),
            ("ZREVRANGE", layout.removes(kb), 0, last, "WITHSCORES"),
        ]
    elif kind in ("set", "totals"):
        build = lambda kb, _: [("TYPE", layout.removes(kb)), ("ZREVRANGE", layout.adds(kb), 0, last, "WITHSCORES")]  # noqa: E731
    elif kind == "counts":  # only a counters key's K+ is a hash (its fences in it, or in K-): HGETALL tells
        build = lambda kb, _: [("HGETALL", layout.adds(kb))]  # noqa: E731
    else:
        return _dumped(cluster, keys, limit)
    encoded = cluster._encoder.keys(keys)
    result = read(cluster._transport, keys, encoded, build, lambda _, replies: replies, streamed=True)
    if result.errors:
        _raise(cluster, kind, result.errors, dict(result))
    out = Columns(kind, tombstones)
    for key in keys:
        replies = result[key]
        if kind == "set" and tombstones:
            both = [(m, s, True) for m, s in _pairs(replies[0])] + [(m, s, False) for m, s in _pairs(replies[1])]
            both.sort(key=lambda t: (t[1], t[0]), reverse=True)
            out.pairs(key, both[:limit])
            continue
        if kind == "counts":
            counts = sorted(((int(v), f) for f, v in counters_of(_fields(replies[0]))), reverse=True)[:limit]
            _aggregate(out, key, "counts", [(f, c) for c, f in counts])
            continue
        fenced = replies[0] in (b"hash", "hash")  # an aggregate's fences
        if not replies[1]:
            continue  # nothing (or an aggregate whose totals expired): no rows, whatever the kind
        if fenced != (kind != "set"):
            _raise(cluster, kind, {key: ShardFailure(cluster.shard_of(key), TypeError(kind), ())}, {})
        if kind == "set":
            out.pairs(key, _pairs(replies[1]))
        else:
            _aggregate(out, key, "totals", _pairs(replies[1]))
    return out.batch(cluster.shard_of)


def _pairs(reply: list[Any]) -> list[Any]:
    """A raw ``ZREVRANGE ... WITHSCORES`` reply as (member, score) pairs: RESP3 answers pairs already (the
    score a float), RESP2 one flat list of members and scores (bytes)."""
    if not reply or isinstance(reply[0], list):
        return reply
    return list(zip(reply[0::2], map(float, reply[1::2]), strict=True))


def _fields(reply: dict[Any, Any] | list[Any]) -> Iterable[tuple[Any, Any]]:
    """A raw ``HGETALL`` reply's (field, value) pairs: a map in RESP3, a flat list in RESP2."""
    return reply.items() if isinstance(reply, dict) else zip(reply[0::2], reply[1::2], strict=True)


def _aggregate(out: Columns, key: Any, kind: str, pairs: list[tuple[Any, Any]]) -> None:
    """Aggregate rows of ``key``: (member, total) pairs of a sums key, (field, count) of a counters key."""
    n = len(pairs)
    cols = out.columns
    cols[0] += [key] * n
    cols[1] += [kind.encode()] * n
    cols[2] += [m for m, _ in pairs]
    cols[3 if kind == "totals" else 4] += [v for _, v in pairs]
    cols[4 if kind == "totals" else 3] += [None] * n


def _dumped(cluster: Cluster, keys: list[Any], limit: int) -> pa.RecordBatch:
    """``aggregates``: each key's kind and totals in one script call (``lua/aggregate.lua``'s dump)."""
    states = whole_keys_of(cluster).states(keys, dump=True)
    if states.errors:
        raise PartialReadError(dict(states.items()), dict(states.errors.items()))
    out = Columns("aggregates", False)
    for key in keys:
        state = states[key]
        flat = state.totals or []
        if state.kind == "2":
            raise KeyKindError(key, _NAMES["2"], _WANTED["aggregates"], cluster.shard_of(key))
        if state.kind == "s":
            sums = sorted(((float(flat[j + 1]), flat[j]) for j in range(0, len(flat), 2)), reverse=True)[:limit]
            _aggregate(out, key, "totals", [(m, t) for t, m in sums])
        elif state.kind == "c":
            counts = sorted(((int(flat[j + 1]), flat[j]) for j in range(0, len(flat), 2)), reverse=True)[:limit]
            _aggregate(out, key, "counts", [(f, c) for c, f in counts])
    return out.batch(cluster.shard_of)


def _raise(cluster: Cluster, kind: str, errors: dict[Any, ShardFailure], results: dict[Any, Any]) -> None:
    """A key of another kind among ``errors`` (a WRONGTYPE reply, or a kind the replies showed) raises
    :class:`KeyKindError` naming it; otherwise the shards' failures raise :class:`PartialReadError`."""
    keys = list(errors)
    states = whole_keys_of(cluster).states(keys)
    for key in keys:
        state = states.get(key)
        if state is not None and state.kind not in ("", "a") and _NAMES[state.kind] != _WANTED[kind]:
            raise KeyKindError(key, _NAMES[state.kind], _WANTED[kind], cluster.shard_of(key))
    raise PartialReadError(results, errors)


def farm_rows(farm: Farm, keys: list[Any], kind: str, limit: int) -> pa.RecordBatch:
    """One Arrow batch: the rows of ``keys`` read from ``farm`` under its read strategy (``select`` for
    sets, ``top`` for totals, ``counters`` for counts), after every replica's kinds of them were checked."""
    for i, states in enumerate(farm.per_replica(lambda c: whole_keys_of(c).states(keys), keys)):
        for key, state in states.items():  # a replica that failed here fails (or not) the read below
            if state.kind not in ("", "a") and _NAMES[state.kind] != _WANTED[kind]:
                raise KeyKindError(key, _NAMES[state.kind], _WANTED[kind], f"replica {farm.names[i]}")
    out = Columns(kind, False)
    if kind == "set":
        for key, items in farm.select(keys, limit=limit).items():
            out.pairs(key, [(t.member, t.score) for t in items])
    elif kind == "totals":
        for key, items in farm.top(keys, 0, limit).items():
            _aggregate(out, key, "totals", [(t.member, t.score) for t in items])
    else:
        for key, fields in farm.counters(keys).items():
            counts = sorted(((c, f) for f, c in fields.items()), reverse=True)[:limit]
            _aggregate(out, key, "counts", [(f, c) for c, f in counts])
    return out.batch(lambda _: "the farm")
