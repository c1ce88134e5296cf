"""Validation and encoding: caller tuples and keys into Redis keys and write-script calls.

Everything here runs before anything is sent, so a bad tuple raises :class:`InvalidTupleError` (naming
its index) with nothing of the call applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from zcluster._fasttuples import native_untrack
from zcluster._keys import SLOTS, KeyLayout
from zcluster._topology import Topology
from zcluster.errors import ConfigError, InvalidTupleError
from zcluster.types import Blob, Delete, Insert, KeyMember, KeyScoreMember, to_bytes

INSERT, DELETE = b"+", b"-"
"""The write script's op argument: the only place a write is spelled as bytes."""

# The tuple types a write comes as, read by index (see Encoder.writes): Final, so that compiled
# (zcluster._native) each is a C static, where an imported name is a dict lookup at each use.
_INSERT: Final = Insert
_DELETE: Final = Delete
_KSM: Final = KeyScoreMember
# A call's lists (keys, arguments, indices: atomic values only) taken off the cyclic garbage collector's lists:
# thousands of slots each, walked by every collection they lived through (see zcluster._fasttuples).
_UNTRACK: Final = native_untrack()

MAX_EXACT_INT = 1 << 53


def check_score(value: object) -> float:
    """``value`` as a finite double; raises ValueError (or TypeError for non-numbers) saying why.

    Integers must be exact as doubles: above 2**53 only those a double holds exactly are accepted.
    """
    if type(value) is float:
        if value - value == 0.0:  # false for NaN and both infinities
            return value
        raise ValueError(f"score must be a finite number, got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool):
        if -MAX_EXACT_INT <= value <= MAX_EXACT_INT:
            return float(value)
        try:
            as_float = float(value)
        except OverflowError:
            raise ValueError(f"integer score of {value.bit_length()} bits is beyond the range of a double") from None
        if int(as_float) == value:  # compared as ints: compiled (zcluster._native), int == float compares as floats
            return as_float
        shown = value if value.bit_length() <= 256 else f"of {value.bit_length()} bits"
        raise ValueError(f"integer score {shown} is not exact as a double (|x| > 2**53)")
    if isinstance(value, float):  # a float subclass
        return check_score(float(value))
    raise TypeError(f"score must be int or float, not {type(value).__name__}")


def score(value: object, index: int, item: object) -> float:
    """:func:`check_score` for tuple ``index`` of a call: failures are :class:`InvalidTupleError`."""
    if type(value) is float and value - value == 0.0:  # the common case, inline
        return value
    try:
        return check_score(value)
    except (ValueError, TypeError) as exc:
        raise InvalidTupleError(index, item, str(exc)) from None


def blob(value: object, index: int, item: object, what: str) -> bytes:
    """A key or member as stored bytes (a str as UTF-8, its surrogate escapes as the bytes they stand for);
    anything but str/bytes is :class:`InvalidTupleError`."""
    if type(value) is bytes:
        return value
    if type(value) is str:
        text: str = value
        # Strict UTF-8 first: compiled (zcluster._native), one C call, where a method call with an error handler
        # costs about 600 instructions (writes call this twice a tuple); it raises for any surrogate. A try, not
        # contextlib.suppress: compiled, a with statement is two method calls on a new object.
        try:
            return text.encode()
        except UnicodeEncodeError:
            pass
    try:
        if type(value) is str:
            return value.encode("utf-8", "surrogateescape")
        if isinstance(value, bytes):  # a subclass: its bytes (the encoder's lists hold exact bytes only)
            return bytes(value)
        if isinstance(value, str):
            return to_bytes(value)
    except UnicodeEncodeError:  # a lone surrogate outside the escaped-byte range
        raise InvalidTupleError(index, item, f"{what} is not encodable as UTF-8 (a lone surrogate)") from None
    raise InvalidTupleError(index, item, f"{what} must be str or bytes, not {type(value).__name__}")


def listed_keys(keys: Iterable[Blob]) -> list[Blob]:
    """``keys`` as a list; a single str or bytes is a TypeError (iterating it would ask one key per character)."""
    whole: object = keys  # mypy narrows an Iterable[Blob] to str only, and compiled (zcluster._native) bytes fail it
    if isinstance(whole, str | bytes):
        raise TypeError(f"keys must be an iterable of keys, not a single {type(whole).__name__}: use [{whole!r}]")
    return list(keys)


def positive(value: object, name: str) -> int:
    """``value`` if it is a positive int; else :class:`ConfigError` (a ValueError) naming ``name``: the one
    rule for every size, limit and count option of the library."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive int, got {value!r}")
    return value


def check_limit(limit: int, offset: int = 0) -> None:
    """Validate select paging arguments: ``limit`` > 0 and ``offset`` >= 0 (:class:`ConfigError` otherwise)."""
    positive(limit, "limit")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ConfigError(f"offset must be a non-negative int, got {offset!r}")


def key_members(items: Iterable[Any]) -> list[KeyMember]:
    """(key, member) pairs as :class:`KeyMember`; anything else is :class:`InvalidTupleError` naming it."""
    if isinstance(items, str | bytes):
        raise TypeError("score() takes (key, member) pairs, not a single str or bytes")
    out = []
    for i, km in enumerate(items):
        if type(km) is KeyMember:
            out.append(km)
            continue
        try:
            key, member = km
        except (TypeError, ValueError):
            raise InvalidTupleError(i, km, "expected a (key, member) pair") from None
        out.append(KeyMember(key, member))
    return out


def score_pairs(raw: list[Any]) -> list[tuple[bytes, float]]:
    """(member, score) pairs of a WITHSCORES reply, flat (older redis-py) or already paired (redis-py 8)."""
    if raw and isinstance(raw[0], list | tuple):
        return [(m, float(s)) for m, s in raw]
    return [(raw[j], float(raw[j + 1])) for j in range(0, len(raw), 2)]


@dataclass
class Call:
    """One write-script call: the caller's indices of its tuples, its KEYS, and its per-key ARGV.

    ``inline``: the call carries keys of several slots of one Redis Cluster node in ARGV (the script's
    "k"/"K" modes), and ``keys`` is empty. ``singles``: how many groups at the start of ``argv`` hold one
    tuple and are written without their count (the script's ARGV[4]); the other groups follow in the
    ``more_`` lists: the call's tuples are ``indices + more_indices``, its KEYS ``keys + more_keys``, its
    per-key ARGV ``argv + more_argv``.
    """

    indices: list[int]
    keys: list[bytes]
    argv: list[Any]
    inline: bool = False
    singles: int = 0
    more_indices: list[int] = field(default_factory=list)
    more_keys: list[bytes] = field(default_factory=list)
    more_argv: list[Any] = field(default_factory=list)


def _call(inline: bool) -> Call:
    call = Call([], [], [], inline)
    if _UNTRACK is not None:
        for held in (call.indices, call.keys, call.argv, call.more_indices, call.more_keys, call.more_argv):
            _UNTRACK(held)
    return call


class Encoder:
    """Routes and packs tuples for one layout over one topology."""

    def __init__(self, layout: KeyLayout, topology: Topology, floors: bool, batch_size: int) -> None:
        self.layout, self.topology, self.floors, self.batch_size = layout, topology, floors, batch_size

    def keys(self, keys: Sequence[Blob]) -> list[tuple[int, bytes]]:
        """(shard index, encoded key) per key; a bad or empty key is :class:`InvalidTupleError`."""
        out = []
        layout, topo = self.layout, self.topology
        for i, key in enumerate(keys):
            kb = blob(key, i, key, "key")
            if not kb:
                raise InvalidTupleError(i, key, "key must not be empty")
            out.append((topo.shard_of(kb, layout.slot(kb)), kb))
        return out

    def writes(
        self, items: Sequence[Any], indices: Sequence[int] | None = None, node_calls: bool = False
    ) -> dict[int, list[Call]]:
        """Validate every tuple, then pack them into script calls per shard (on a Redis Cluster: per node
        with the keys inline with ``node_calls``, else per slot; see :class:`Call`).

        ``indices[j]`` is the caller's position of ``items[j]`` (default: j). A call holds groups of
        tuples of one logical key each (its Redis keys are sent once, and the script reads and writes
        each group's sets in a few commands); a key's tuples keep the caller's order. A call never holds
        more than ``batch_size`` tuples, and a key's tuples up to that many are all in one call (a call
        with too little room left goes as it is), so one call applies them atomically; a key of more runs
        on over calls of ``batch_size``. A call's one-tuple keys come first (:attr:`Call.singles`).
        """
        layout, topo = self.layout, self.topology
        # Pass 1: validate, and group by logical key as flat [index, score, member, index, score, member, ...]
        # lists: one list per key (most keys of spread writes have one tuple), where each list is one more
        # object for the garbage collector to count and walk.
        keyed: dict[bytes, list[Any]] = {}
        positions = None if indices is None else list(indices)  # compiled (zcluster._native): indexed natively
        for j, item in enumerate(items):
            i = j if positions is None else positions[j]
            kind = type(item)
            if kind is _INSERT or kind is _DELETE or kind is _KSM or (kind is tuple and len(item) == 3):
                # Read by index: compiled (zcluster._native), unpacking an Any takes an iterator and its calls.
                row: tuple[Any, ...] = item
                key, value, member = row[0], row[1], row[2]
            else:
                try:
                    key, value, member = item
                except (TypeError, ValueError):
                    raise InvalidTupleError(i, item, "expected a (key, score, member) tuple") from None
            kb, mb = blob(key, i, item, "key"), blob(member, i, item, "member")
            # The caller's float object itself, not an equal one: compiled, a float-typed local is unboxed,
            # and stored in a list again it is a new object.
            s: object = value
            if not (type(value) is float and value - value == 0.0):
                s = score(value, i, item)
            entry = keyed.get(kb)
            if entry is None:
                if not kb:
                    raise InvalidTupleError(i, item, "key must not be empty")
                keyed[kb] = entry = [i, s, mb]
                if _UNTRACK is not None:  # atomic values only, ever: nothing for the collector to walk
                    _UNTRACK(entry)
            else:  # appends: compiled (zcluster._native), a C call each, where += of a tuple makes one
                entry.append(i)
                entry.append(s)
                entry.append(mb)
        # Pass 2: route each key once and pack its tuples into calls of its shard (or slot).
        per_shard: dict[int, list[Call]] = {}
        filling: dict[int, Call] = {}
        size, floors = self.batch_size, self.floors
        inline = node_calls and topo.single_slot_calls
        one_slot = topo.single_slot_calls and not inline
        only = 0 if len(topo.shards) == 1 and not topo.single_slot_calls else None  # one server: no routing
        for kb, entry in keyed.items():
            if only is None:
                slot = layout.slot(kb)
                shard = topo.shard_of(kb, slot)
                group = shard * SLOTS + slot if one_slot else shard
            else:
                shard = group = only
            rkeys = layout.script_keys(kb, floors)
            n = len(entry) // 3
            if n == 1:  # a one-tuple group: at the head of its call, without its count (Call.singles)
                call = filling.get(group)
                if call is None:
                    call = filling[group] = _call(inline)
                (call.argv if inline else call.keys).extend(rkeys)  # extend, not +=: compiled, a C call
                call.argv.append(entry[1])
                call.argv.append(entry[2])
                call.indices.append(entry[0])
                call.singles += 1
                if call.singles + len(call.more_indices) >= size:
                    per_shard.setdefault(shard, []).append(filling.pop(group))
                continue
            held = filling.get(group)
            if held is not None and n <= size and held.singles + len(held.more_indices) + n > size:
                # The key's tuples would not fit what is left: they start the next call, all together.
                per_shard.setdefault(shard, []).append(filling.pop(group))
                held = None
            done = 0
            while done < n:
                if held is None:
                    held = filling[group] = _call(inline)
                call = held
                take = min(size - call.singles - len(call.more_indices), n - done)
                argv, taken = call.more_argv, call.more_indices
                (argv if inline else call.more_keys).extend(rkeys)
                argv.append(b"1" if take == 1 else take)  # bytes: the packer sends them as is
                for at in range(3 * done, 3 * (done + take), 3):  # appends: compiled, a C call each
                    argv.append(entry[at + 1])
                    argv.append(entry[at + 2])
                    taken.append(entry[at])
                done += take
                if call.singles + len(taken) >= size:
                    per_shard.setdefault(shard, []).append(filling.pop(group))
                    held = None
        for group, call in filling.items():
            per_shard.setdefault(group // SLOTS if one_slot else group, []).append(call)
        return per_shard
