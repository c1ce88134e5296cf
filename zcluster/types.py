"""Value types shared by every layer: tuples, writes, presence, cursors, write outcomes, durability.

Keys and members are ``str`` or ``bytes``. ``str`` is encoded as UTF-8 with the ``surrogateescape`` error
handler, so any byte string can also be written as the ``str`` that reads return, and raw non-UTF-8 bytes
round-trip unchanged. Reads return ``str`` decoded the same way unless the cluster was built with
``decode=False``, in which case they return ``bytes``.

Why this module is long: it is the one module of value types every layer shares (writes, presence, cursors,
results, durability, the Store protocol), so that no layer imports another for a type.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from zcluster._fasttuples import native_construct
from zcluster.errors import ConfigError, PartialWriteError, WriteRefusedError

Blob = str | bytes
K = TypeVar("K")
V = TypeVar("V")


class KeyScoreMember(NamedTuple):
    """One element of a logical set: ``member`` in set ``key`` at ``score`` (a finite IEEE-754 double)."""

    key: Blob
    score: float
    member: Blob


class Insert(NamedTuple):
    """A write that adds ``member`` to ``key`` at ``score`` (see :meth:`zcluster.Cluster.apply`)."""

    key: Blob
    score: float
    member: Blob


class Delete(NamedTuple):
    """A write that removes ``member`` from ``key`` at ``score``, leaving a tombstone."""

    key: Blob
    score: float
    member: Blob


Write = Insert | Delete
"""One CRDT write: the only spelling of a write in zcluster (a plain 3-tuple or KeyScoreMember is an insert
where an :class:`Insert` is accepted)."""


class Publish(NamedTuple):
    """A message a mapper publishes to ``journal`` (a journal name, or a ``MappingFunc`` of
    :mod:`zcluster.message.mapping` choosing one per message, as a ``Publisher`` does): part of the
    consumer's transaction, so read-committed readers of ``journal`` see it exactly once when the
    transaction that published it is checkpointed, and never if it is abandoned. ``message`` must implement
    the message protocol (:class:`zcluster.message.Message`, e.g. a ``JsonMessage``). Only an applier given a
    journal store to publish to accepts it (``Consumer(..., publish=...)``, ``ZClusterSink(..., publish=url)``,
    ``PositionedSink(..., publish=url)``); see :mod:`zcluster.state.txn`."""

    journal: Any
    message: Any


class Incr(NamedTuple):
    """Add ``delta`` to ``member``'s total in the sums key ``key`` (a leaderboard, a sum per member): the
    totals are the scores of a sorted set, so :meth:`zcluster.Cluster.select` reads them highest first.

    Totals are doubles: sums of integers are exact while every total stays within 2**53 in magnitude; past
    that, and for fractional deltas, each addition rounds as IEEE-754 addition does (a replay never adds
    twice, so the rounding is the same on every replica and every run). A total that would stop being a
    finite number (past the largest double, about 1.8e308) is refused, never kept as infinity. Applied once
    per position: see
    :meth:`zcluster.Cluster.increment`."""

    key: Blob
    member: Blob
    delta: float


class Count(NamedTuple):
    """Add the integer ``delta`` to counter ``field`` of the counters key ``key`` (exact int64 totals, kept
    in a hash, beside the key's fences). A total that would leave the int64 range is refused, never wrapped.
    A ``field`` starting with ``b"\\x00zc|"`` (the fences' prefix) is a :class:`zcluster.InvalidTupleError`.
    Applied once per position: see :meth:`zcluster.Cluster.increment`."""

    key: Blob
    field: Blob
    delta: int


Increment = Incr | Count
"""An aggregate write: not idempotent by itself, applied exactly once by its fence (source, position)."""


def _native_constructors() -> None:
    """Built with the compiled hot path (zcluster._native): the three-field NamedTuples above made by a C
    constructor, at about a plain tuple's cost (zcluster/_tuples.c: same instances; any call but three
    positional arguments goes to the NamedTuple's own). Without a build, over a stale one or under
    ZCLUSTER_PURE they keep their own, which costs time only."""
    construct = native_construct()
    if construct is not None:
        for cls in (KeyScoreMember, Insert, Delete, Incr, Count):
            construct(cls)


_native_constructors()


class Fence(NamedTuple):
    """What an aggregate key holds of one source (:meth:`zcluster.Cluster.fences`): the ``position`` (c, m,
    j) of the last increment applied from it, and ``held``, how many of its increments the key holds.
    Increments of a source reach a key in order, so of two copies of a key (a farm's replicas) the one
    with the higher position and ``held`` holds everything the other holds of that source."""

    position: tuple[int, int, int]
    held: int


class KeyMember(NamedTuple):
    """A member of a logical set, as asked about by :meth:`zcluster.Cluster.score`."""

    key: Blob
    member: Blob


class Presence(NamedTuple):
    """What the cluster knows of one member.

    ``present`` is False when the member was never written (or its record was trimmed away); then
    ``inserted`` is False and ``score`` is NaN. Otherwise ``inserted`` says whether the newest write was an
    insert (the member is visible) or a delete (a tombstone), and ``score`` is that write's score.
    """

    present: bool
    inserted: bool
    score: float


NOT_PRESENT = Presence(False, False, math.nan)

_DOUBLE = struct.Struct(">d")
_UINT64 = struct.Struct(">Q")


def to_bytes(value: Blob) -> bytes:
    """Encode a key or member the way it is stored (UTF-8 with surrogateescape for ``str``)."""
    if isinstance(value, bytes):
        return value
    return value.encode("utf-8", "surrogateescape")


def from_bytes(value: bytes) -> str:
    """Decode a stored key or member; the inverse of :func:`to_bytes` for every byte string."""
    return value.decode("utf-8", "surrogateescape")


@dataclass(frozen=True, order=False)
class Cursor:
    """A position in a set's score-descending order: just after ``(score, member)``.

    The string form is roshi's: the decimal of the score's IEEE-754 bits, ``A``, then the URL-safe base64
    of the member, so cursors handed out by roshi-server clients keep working.
    """

    score: float
    member: Blob

    def __str__(self) -> str:
        bits = _UINT64.unpack(_DOUBLE.pack(float(self.score)))[0]
        return f"{bits}A{base64.urlsafe_b64encode(to_bytes(self.member)).decode('ascii')}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """Parse roshi's cursor string; raises :class:`ValueError` naming what is wrong."""
        bits_text, sep, member_text = text.partition("A")
        if not sep or not bits_text.isdigit():
            raise ValueError(f"invalid cursor {text!r}: expected '<uint64 score bits>A<base64 member>'")
        bits = int(bits_text)
        if bits >= 1 << 64:
            raise ValueError(f"invalid cursor {text!r}: score bits exceed 64 bits")
        try:
            member = base64.b64decode(member_text.encode("ascii"), altchars=b"-_", validate=True)
        except (ValueError, UnicodeEncodeError) as exc:  # binascii.Error is a ValueError
            raise ValueError(f"invalid cursor {text!r}: member is not URL-safe base64 ({exc})") from None
        score = _DOUBLE.unpack(_UINT64.pack(bits))[0]
        return cls(score, from_bytes(member))


@dataclass(frozen=True)
class ShardFailure:
    """A shard that could not complete its part of a call.

    ``shard`` names the server (``host:port``, never credentials); ``indices`` are positions in the
    caller's sequence whose outcome is unknown: they may or may not have been applied (the write is
    idempotent, so resending them is always safe).
    """

    shard: str
    error: BaseException
    indices: tuple[int, ...]

    def __str__(self) -> str:
        return f"shard {self.shard}: {type(self.error).__name__}: {self.error} ({len(self.indices)} tuple(s))"


@dataclass
class WriteResult:
    """Outcome of :meth:`Cluster.insert` / :meth:`Cluster.delete`, per input tuple.

    ``applied[i]`` is True when tuple ``i`` took effect: it was newer than everything the cluster holds for
    its member (and above the key's trim floor, with a size bound). It is False when the tuple was stale
    (an equal or newer write already won) or when its shard failed; the failed ones are listed in
    ``failures``. A stale tuple is not an error: it is the CRDT doing its job.
    """

    applied: list[bool]
    failures: list[ShardFailure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every shard answered (each tuple is either applied or stale)."""
        return not self.failures

    @property
    def applied_count(self) -> int:
        return sum(self.applied)

    @property
    def failed_indices(self) -> list[int]:
        return sorted({i for f in self.failures for i in f.indices})

    @property
    def refused(self) -> WriteRefusedError | None:
        """The error naming the writes the servers refused for good (a key of another kind, an overflowing
        total; see :class:`zcluster.WriteRefusedError`), or None. They are in ``failures`` too."""
        for f in self.failures:
            if isinstance(f.error, WriteRefusedError):
                return f.error
        return None

    def raise_for_failures(self) -> WriteResult:
        """Raise :class:`PartialWriteError` if any shard failed; otherwise return self."""
        if self.failures:
            raise PartialWriteError(self)
        return self


@dataclass(frozen=True)
class Durability:
    """Redis's own durability, waited for after each shard's writes (``Cluster(..., durability=...)``).

    * ``replicas``: at least this many replicas of the shard's master acknowledged receiving the writes
      (``WAIT``: they hold them in memory, whatever their own persistence, so the writes survive a
      failover to one of them). ``WAITAOF 0 n`` is deliberately not used: it counts only replicas that
      fsynced an AOF of their own, so replicas with ``appendonly no`` would never count there.
    * ``local_aof``: the master fsynced the writes to its append-only file (``WAITAOF 1 0``: Redis >= 7.2,
      Valkey; the server needs ``appendonly yes``). A server without WAITAOF, or with the AOF off, cannot
      confirm it: every write is then reported not met, with that reason.
    * ``timeout``: seconds each wait command may block. Shards wait in parallel; with both asked a shard
      waits up to twice that per ask. The connection's ``socket_timeout``, if set, must exceed it, or the
      wait fails as a timeout.
    * ``deadline``: seconds a shard's call keeps asking for a confirmation that fell short (the waits sent
      again on the same connection, each blocking up to ``timeout``) before it reports the shard failed,
      counted from the call's first send (so a failover the call waits out counts in it); never less than
      one ``timeout``. Default 60 s:
      longer than a Redis Cluster failover with Redis's default ``cluster-node-timeout`` (15 s; the replica
      is promoted some 16-20 s after its master died) plus the restarted master's rejoin as the new
      master's replica (measured here, with a 2 s node timeout: promoted ~4 s after the kill, a write
      confirmed 0.2-0.7 s after the node's restart). Until a shard has as many replicas in sync as
      asked, its writes cannot be confirmed: a promoted replica has none until the old master is back, so
      a durable write waits for that. A refusal (no WAITAOF, ``appendonly no``) is reported at once.

    The waits run on the connection that sent the writes, right after them: ``WAIT`` and ``WAITAOF``
    cover only the writes of their own connection. A shard whose writes are not confirmed within the
    deadline is a failure of that shard: its tuples are unconfirmed, the :class:`ShardFailure`'s error is a
    :class:`zcluster.errors.DurabilityError` (saying what to do), and ``insert``/``delete``/``apply`` raise
    :class:`zcluster.PartialWriteError` (or return the failure with ``raise_on_error=False``). The writes
    were executed on the master; resending them is safe and waits again (the exactly-once applier and
    the Spark sink do not resend them: they already waited the deadline). A resend after a lost script
    cache, a cluster redirect or a failover waits again, within the same deadline. The waits cover what the call
    wrote: a tuple the master already held is stale and writes nothing, so its resend confirms what the
    connection last wrote, not the earlier write that made it stale (a replica that stayed connected but
    lagged can thus be counted early after a resend on another connection).

    A picklable, hashable value: :class:`zcluster.ClusterConfig` carries it to Spark executors.
    Raises :class:`zcluster.ConfigError` unless ``replicas >= 0``, ``timeout > 0``, ``deadline > 0`` and
    something is asked.
    """

    replicas: int = 0
    local_aof: bool = False
    timeout: float = 1.0
    deadline: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 0:
            raise ConfigError(f"Durability.replicas must be an int >= 0, got {self.replicas!r}")
        if not isinstance(self.local_aof, bool):
            raise ConfigError(f"Durability.local_aof must be a bool, got {self.local_aof!r}")
        timeout = self.timeout
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < math.inf:
            raise ConfigError(f"Durability.timeout must be a finite number of seconds > 0, got {timeout!r}")
        deadline = self.deadline
        if isinstance(deadline, bool) or not isinstance(deadline, int | float) or not 0 < deadline < math.inf:
            raise ConfigError(f"Durability.deadline must be a finite number of seconds > 0, got {deadline!r}")
        if not self.replicas and not self.local_aof:
            raise ConfigError("Durability asks for nothing: give replicas > 0 and/or local_aof=True")

    @property
    def waits_for(self) -> float:
        """Seconds a shard's call asks for its confirmation at most: ``deadline``, at least ``timeout``."""
        return float(max(self.deadline, self.timeout))

    @property
    def timeout_ms(self) -> int:
        """``timeout`` in whole milliseconds, at least 1 (0 would mean "forever" to WAIT)."""
        return max(1, math.ceil(self.timeout * 1000))


@dataclass(frozen=True)
class ShardStats:
    """What :meth:`zcluster.Cluster.stats` reports of one master shard.

    ``keys`` and ``removed_only`` count the cluster's logical keys (those with an add set, and those
    holding only tombstones); both are None when the scan was skipped. ``open_slots``: on a Redis Cluster, the
    hash slots this master holds open for a migration, each ``"<slot> migrating to <host:port>"`` or
    ``"<slot> importing from <host:port>"`` (empty when none; None on standalone shards, and where the server
    refuses ``CLUSTER NODES``). A slot stays open
    while redis-cli moves it, and for good when redis-cli died mid-reshard: a call whose keys that migration
    split waits up to ``failover_timeout`` in TRYAGAIN, then fails (``redis-cli --cluster fix`` closes it).
    ``module_version``: the protocol zcluster's Redis module on this server speaks (``ZCLUSTER.VERSION``; a
    client uses the module where it is the client's own, :data:`zcluster._server_module.PROTOCOL`), None where
    no module answers. ``error`` is set (and the other figures are None) when the shard did not answer.
    """

    shard: str
    dbsize: int | None = None
    keys: int | None = None
    removed_only: int | None = None
    used_memory: int | None = None
    used_memory_human: str | None = None
    script_loaded: bool | None = None
    version: str | None = None
    open_slots: tuple[str, ...] | None = None
    module_version: int | None = None
    error: str | None = None


class ReadResult(dict[K, V], Generic[K, V]):
    """A dict of answers per key; ``errors`` maps keys whose shard failed to the failure (empty if none).

    Returned by reads with ``strict=False``; with ``strict=True`` (default) a failure raises
    :class:`zcluster.PartialReadError` instead, carrying the same two parts.
    """

    errors: dict[K, ShardFailure]

    def __init__(self) -> None:
        super().__init__()
        self.errors = {}


class Store(Protocol):
    """What the state layer (checkpoints, dedup, the exactly-once applier) writes into and reads from: a
    :class:`zcluster.Cluster`, or a :class:`zcluster.farm.Farm` of replicas. Both implement it with the
    same semantics (see :class:`zcluster.Cluster`); this names the part the state layer relies on."""

    @property
    def prefix(self) -> bytes: ...

    def view(
        self,
        prefix: Blob,
        *,
        max_size: int | None = None,
        floors: bool | None = None,
        batch_size: int | None = None,
        decode: bool | None = None,
        durability: Durability | None = None,
    ) -> Store: ...

    def insert(
        self, tuples: Iterable[KeyScoreMember | tuple[Blob, float, Blob]], *, raise_on_error: bool = True
    ) -> WriteResult: ...

    def delete(
        self, tuples: Iterable[KeyScoreMember | tuple[Blob, float, Blob]], *, raise_on_error: bool = True
    ) -> WriteResult: ...

    def apply(self, writes: Iterable[Insert | Delete], *, raise_on_error: bool = True) -> WriteResult: ...

    def increment(
        self,
        source: str,
        items: Iterable[tuple[int | tuple[int, int] | tuple[int, int, int], Incr | Count]],
        *,
        ttl: int | None = None,
        raise_on_error: bool = True,
    ) -> WriteResult: ...

    def select(
        self, keys: Iterable[Blob], offset: int = 0, limit: int = 10, *, strict: bool = True
    ) -> ReadResult[Blob, list[KeyScoreMember]]: ...

    def score(
        self, key_members: Iterable[KeyMember | tuple[Blob, Blob]], *, strict: bool = True
    ) -> ReadResult[KeyMember, Presence]: ...

    def forget(self, keys: Iterable[Blob], up_to: float) -> int: ...

    def keys(
        self, batch_size: int = 1000, *, include_removed: bool = False, match: Blob | None = None
    ) -> Iterator[list[Blob]]: ...
