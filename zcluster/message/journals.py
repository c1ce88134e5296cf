"""The journal SPI the message layer reads and writes through, and an in-memory implementation.

A journal is a named, append-only byte stream addressed by byte offsets. The message layer never
depends on a concrete journal: a Publisher needs a :class:`JournalWriter`, the read iterators need a
:class:`JournalReader`, and mappings built from label selectors need a :class:`JournalLister`. Real
journals (file fragments, Redis Streams) implement these protocols elsewhere; :class:`InMemoryJournals`
implements all three for tests and examples.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from zcluster.message.errors import JournalError, JournalNotFoundError, OffsetOutOfRangeError
from zcluster.message.labels import LabelSelector, parse_selector

__all__ = [
    "AppendResult",
    "InMemoryJournals",
    "JournalError",
    "JournalLister",
    "JournalNotFoundError",
    "JournalReader",
    "JournalSpec",
    "JournalWriter",
    "OffsetOutOfRangeError",
]


@dataclass(frozen=True)
class JournalSpec:
    name: str  # path-like, e.g. "pageviews/part-003"
    labels: Mapping[str, str]  # must include "content-type"


class AppendResult(NamedTuple):
    begin: int  # byte offset where the appended bytes start
    end: int  # byte offset just past them


class JournalWriter(Protocol):
    def append(self, journal: str, data: bytes) -> AppendResult:
        """Append `data` to `journal` and return the byte range it occupies.

        Atomic per call: the bytes are written contiguously, never interleaved with another append,
        and either all of them become readable or none do. Ordered per journal: appends that return
        in some order occupy increasing offsets in that order. Raises JournalNotFoundError for an
        unknown journal.
        """
        ...


class JournalReader(Protocol):
    def read(
        self, journal: str, offset: int, *, block: bool = False, timeout: float | None = None
    ) -> Iterator[tuple[int, bytes]]:
        """Yield (begin_offset, chunk) with contiguous chunks from `offset` to the current end (block=False)
        or, with block=True, keep yielding newly appended chunks until `timeout` seconds pass without new
        data (None: wait forever).

        Each chunk starts where the previous one ended; the first starts at `offset`. Chunk boundaries
        are arbitrary: they may split a message frame anywhere, and readers must reassemble. Raises
        JournalNotFoundError for an unknown journal and OffsetOutOfRangeError if `offset` is negative
        or beyond the journal's end when the read starts.
        """
        ...


class JournalLister(Protocol):
    def list(self, selector: LabelSelector | str) -> list[JournalSpec]:
        """Return the journals whose labels match `selector` (a LabelSelector or its text form),
        sorted by name. Raises SelectorError for a malformed selector string."""
        ...


class _Journal:
    __slots__ = ("data", "spec")

    def __init__(self, spec: JournalSpec) -> None:
        self.spec = spec
        self.data = bytearray()


class InMemoryJournals:
    """Thread-safe in-memory journals implementing JournalWriter, JournalReader and JournalLister.

    `chunk_size` bounds the size of chunks yielded by read(), so tests can exercise frames split
    across chunks (chunk_size=1 splits every byte).
    """

    def __init__(self, specs: Iterable[JournalSpec] = (), *, chunk_size: int = 1 << 16):
        if chunk_size < 1:
            raise ValueError("chunk_size must be positive")
        self._chunk_size = chunk_size
        self._journals: dict[str, _Journal] = {}
        self._cond = threading.Condition()
        for spec in specs:
            self.create(spec)

    def create(self, spec: JournalSpec) -> None:
        """Create an empty journal. Raises ValueError if it exists or lacks a content-type label."""
        if "content-type" not in spec.labels:
            raise ValueError(f"journal {spec.name!r}: labels must include 'content-type'")
        with self._cond:
            if spec.name in self._journals:
                raise ValueError(f"journal {spec.name!r} already exists")
            self._journals[spec.name] = _Journal(JournalSpec(spec.name, dict(spec.labels)))

    def spec(self, journal: str) -> JournalSpec:
        """Return the spec of `journal`; JournalNotFoundError if unknown."""
        with self._cond:
            return self._get(journal).spec

    def end(self, journal: str) -> int:
        """Return the current end offset (the length in bytes) of `journal`."""
        with self._cond:
            return len(self._get(journal).data)

    def content(self, journal: str) -> bytes:
        """Return every byte of `journal` (for tests)."""
        with self._cond:
            return bytes(self._get(journal).data)

    def append(self, journal: str, data: bytes) -> AppendResult:
        with self._cond:
            buf = self._get(journal).data
            begin = len(buf)
            buf += data
            self._cond.notify_all()
            return AppendResult(begin, len(buf))

    def read(
        self, journal: str, offset: int, *, block: bool = False, timeout: float | None = None
    ) -> Iterator[tuple[int, bytes]]:
        with self._cond:
            end = len(self._get(journal).data)
        if offset < 0 or offset > end:
            raise OffsetOutOfRangeError(f"journal {journal!r}: offset {offset} outside [0, {end}]")
        return self._read(journal, offset, block, timeout)

    def _read(self, journal: str, offset: int, block: bool, timeout: float | None) -> Iterator[tuple[int, bytes]]:
        while True:
            with self._cond:
                buf = self._get(journal).data
                if len(buf) <= offset and block:
                    deadline = None if timeout is None else time.monotonic() + timeout
                    while len(buf) <= offset:
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            return
                        self._cond.wait(remaining)
                if len(buf) <= offset:
                    return
                chunk = bytes(buf[offset : offset + self._chunk_size])
            # Yield outside the lock so a slow consumer never blocks appenders.
            yield offset, chunk
            offset += len(chunk)

    def list(self, selector: LabelSelector | str) -> list[JournalSpec]:
        sel = parse_selector(selector) if isinstance(selector, str) else selector
        with self._cond:
            specs = [j.spec for j in self._journals.values()]
        return sorted((s for s in specs if sel.matches(s.labels)), key=lambda s: s.name)

    def _get(self, journal: str) -> _Journal:
        try:
            return self._journals[journal]
        except KeyError:
            raise JournalNotFoundError(f"journal {journal!r} not found") from None
