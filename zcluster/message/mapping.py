"""Mapping messages to journals, with Gazette's algorithms so Python and Go pick the same journal.

A mapping is a function ``msg -> (journal name, content type)``. Partitions are the candidate
journals, in order; with the same key and the same ordered partition names, ``modulo_mapping`` and
``rendezvous_mapping`` choose exactly the journal Gazette's ``ModuloMapping`` / ``RendezvousMapping``
choose. Mappings raise EmptyPartitionsError when no journal is available (Gazette's
ErrEmptyListResponse), which callers may retry later.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from zcluster.message.envelope import Message
from zcluster.message.errors import EmptyPartitionsError, SelectorError
from zcluster.message.journals import JournalLister, JournalSpec
from zcluster.message.labels import LabelSelector, parse_selector

__all__ = [
    "EmptyPartitionsError",
    "LabelSelector",
    "MappingFunc",
    "PartitionsFunc",
    "SelectorError",
    "fnv1a32",
    "modulo_mapping",
    "parse_selector",
    "partitions_from",
    "random_mapping",
    "rendezvous_mapping",
]

PartitionsFunc = Callable[[], Sequence[JournalSpec]]
"""Returns the current candidate journals, in a stable order."""

# MappingFunc and KeyFunc take Any, not Message, on purpose: publishers call them with Messages, but a
# user's mapping or key function is typed for its own message class (``def key(m: Order) -> str``), which
# a Callable[[Message], ...] would reject (callables are contravariant in their parameters).
MappingFunc = Callable[[Any], tuple[str, str]]
"""Maps a message to (journal name, content type of that journal)."""

KeyFunc = Callable[[Any], bytes | str]
"""Extracts a message's mapping key; str keys are hashed as their UTF-8 bytes."""

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def fnv1a32(data: bytes | str) -> int:
    """32-bit FNV-1a of `data` (str is hashed as UTF-8): Go's ``hash/fnv.New32a``."""
    h = _FNV_OFFSET
    if isinstance(data, str):
        data = data.encode()
    elif not isinstance(data, bytes | bytearray | memoryview):
        # A key function returning an int would otherwise fail as "'int' object is not iterable".
        raise TypeError(f"a mapping key must be str or bytes, got {type(data).__name__} {data!r}")
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFF
    return h


def _content_type(spec: JournalSpec) -> str:
    return spec.labels.get("content-type", "")


def _require(parts: Sequence[JournalSpec]) -> None:
    if not parts:
        raise EmptyPartitionsError("no journals match the mapping's partitions")


def random_mapping(partitions: PartitionsFunc) -> MappingFunc:
    """Map each message to a uniformly random partition."""

    def mapping(msg: Message) -> tuple[str, str]:
        parts = partitions()
        _require(parts)
        spec = parts[random.randrange(len(parts))]
        return spec.name, _content_type(spec)

    return mapping


def modulo_mapping(key: KeyFunc, partitions: PartitionsFunc) -> MappingFunc:
    """Map a message to ``partitions[fnv1a32(key(msg)) % len(partitions)]``.

    Stable while the partition list is unchanged; most keys move when it changes size.
    """

    def mapping(msg: Message) -> tuple[str, str]:
        parts = partitions()
        _require(parts)
        spec = parts[fnv1a32(key(msg)) % len(parts)]
        return spec.name, _content_type(spec)

    return mapping


def rendezvous_mapping(key: KeyFunc, partitions: PartitionsFunc) -> MappingFunc:
    """Highest-random-weight mapping: the weight of partition i is ``fnv1a32(key) ^ fnv1a32(name_i)``;
    the highest weight wins, ties go to the lowest index. Adding or removing a partition only moves
    the keys that pick (or picked) it. Journal-name hashes are cached while `partitions` keeps
    returning the same list object.
    """
    lock = threading.Lock()
    cache: list[Any] = [None, []]  # [last partitions object, its name hashes]

    def mapping(msg: Message) -> tuple[str, str]:
        parts = partitions()
        with lock:
            if cache[0] is not parts:
                cache[0], cache[1] = parts, [fnv1a32(s.name) for s in parts]
            hashes: list[int] = cache[1]
        _require(parts)
        sum_ = fnv1a32(key(msg))
        best, ind = 0, 0
        for i, h in enumerate(hashes):
            w = sum_ ^ h
            if w > best:
                best, ind = w, i
        spec = parts[ind]
        return spec.name, _content_type(spec)

    return mapping


def partitions_from(
    lister: JournalLister, selector: LabelSelector | str, *, refresh_interval: float = 1.0
) -> PartitionsFunc:
    """Return a PartitionsFunc listing the journals that match `selector`, sorted by name.

    The list is fetched again at most every `refresh_interval` seconds (0: on every call), and the
    same list object is returned in between so rendezvous hashes stay cached. Raises SelectorError
    at once for a malformed selector string.
    """
    sel = parse_selector(selector) if isinstance(selector, str) else selector
    lock = threading.Lock()
    state: list[Any] = [None, 0.0]  # [cached list, monotonic time fetched]

    def partitions() -> Sequence[JournalSpec]:
        now = time.monotonic()
        with lock:
            if state[0] is None or now - state[1] >= refresh_interval:
                fresh = lister.list(sel)
                if fresh != state[0]:
                    state[0] = fresh
                state[1] = now
            parts: Sequence[JournalSpec] = state[0]
        return parts

    return partitions
