"""The storage contract both journal backends implement, and the errors and names they share.

:class:`JournalStore` extends the message layer's journal SPI (``JournalWriter``, ``JournalReader``,
``JournalLister``) with what the channel, dispatch and publishing layers need: creating and destroying
journals, owner/description metadata, batched appends, the end offset, durable per-group read
positions kept in the journal's own store, and which of its errors are transient.
"""

from __future__ import annotations

import builtins
import functools
import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from zcluster.message.journals import AppendResult, JournalSpec
from zcluster.message.labels import LabelSelector

__all__ = [
    "CONTENT_TYPE_LABEL",
    "JournalInfo",
    "JournalStore",
    "append_results",
    "close_store",
    "validate_group",
    "validate_journal_name",
    "validate_labels",
]

CONTENT_TYPE_LABEL = "content-type"

_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]*")


_new_result = functools.partial(tuple.__new__, AppendResult)  # C-level constructor: no per-item Python frame


def close_store(store: object) -> None:
    """Close ``store`` if it has a ``close`` (the JournalStore protocol does not require one)."""
    close = getattr(store, "close", None)
    if close is not None:
        close()


def append_results(begin: int, items: Sequence[bytes]) -> builtins.list[AppendResult]:
    """The byte ranges of `items` appended contiguously from offset `begin`."""
    return list(map(_new_result, itertools.pairwise(itertools.accumulate(map(len, items), initial=begin))))


@dataclass(frozen=True)
class JournalInfo:
    """A journal's name, labels (including ``content-type``) and free-form metadata (owner, description...).

    ``uid``: the journal's identity, a random id made when it was created: a journal destroyed and created
    again under the same name has another (checkpoints are bound to it). "" for journals created before
    identities existed.
    """

    name: str
    labels: Mapping[str, str]
    metadata: Mapping[str, str] = field(default_factory=dict)
    uid: str = ""

    @property
    def spec(self) -> JournalSpec:
        return JournalSpec(self.name, dict(self.labels))


def validate_journal_name(name: str) -> str:
    """Return `name` if it is a valid journal name, else raise ValueError saying why.

    A name is one or more ``/``-separated segments, each ``[A-Za-z0-9][A-Za-z0-9._=-]*``: no empty,
    ``.``/``..`` or hidden (``.``/``_``-prefixed) segments, so a name maps safely onto a directory path.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"journal name {name!r} is empty or not a string")
    for seg in name.split("/"):
        if not _SEGMENT.fullmatch(seg):
            raise ValueError(f"journal name {name!r}: segment {seg!r} must match [A-Za-z0-9][A-Za-z0-9._=-]*")
    return name


def validate_group(group: str) -> str:
    """Return `group` if it is a valid consumer-group name (one name segment), else raise ValueError."""
    if not isinstance(group, str) or not _SEGMENT.fullmatch(group):
        raise ValueError(f"consumer group {group!r} must match [A-Za-z0-9][A-Za-z0-9._=-]*")
    return group


def validate_labels(name: str, labels: Mapping[str, str]) -> dict[str, str]:
    """Return a copy of `labels`; ValueError unless ``content-type`` is present and all keys/values are str."""
    out = dict(labels)
    if not out.get(CONTENT_TYPE_LABEL):
        raise ValueError(f"journal {name!r}: labels must include a non-empty 'content-type'")
    for k, v in out.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f"journal {name!r}: label {k!r}={v!r} must be str=str")
    return out


class JournalStore(Protocol):
    """A set of journals: the message layer's writer/reader/lister SPI plus management and positions.

    Implementations guarantee, per journal: appends are atomic per call (a reader never sees part of
    one), serialised and ordered; offsets are byte offsets starting at 0; readers see exactly the bytes
    appended, in order. Unknown journals raise JournalNotFoundError.
    """

    transient_errors: tuple[type[BaseException], ...]
    """The errors of this store after which an append may or may not have happened and a retry may
    succeed (network failures, timeouts): what ``AsyncPublisher`` retries by default."""

    def create(self, spec: JournalSpec, metadata: Mapping[str, str] | None = None) -> None:
        """Create an empty journal. JournalExistsError if it exists; ValueError for a bad name or labels."""
        ...

    def destroy(self, journal: str) -> None:
        """Delete the journal, its data and its group positions. JournalNotFoundError if unknown."""
        ...

    def info(self, journal: str) -> JournalInfo:
        """Return the journal's name, labels and metadata."""
        ...

    def update_metadata(self, journal: str, metadata: Mapping[str, str]) -> None:
        """Merge `metadata` into the journal's metadata (labels are immutable)."""
        ...

    def list(self, selector: LabelSelector | str) -> builtins.list[JournalSpec]:
        """Journals whose labels match `selector`, sorted by name."""
        ...

    def append(self, journal: str, data: bytes) -> AppendResult:
        """Append `data` atomically; return its [begin, end) byte range."""
        ...

    def append_many(self, journal: str, items: Sequence[bytes]) -> builtins.list[AppendResult]:
        """Append `items` contiguously in order, as one atomic unit; return each item's byte range."""
        ...

    def read(
        self, journal: str, offset: int, *, block: bool = False, timeout: float | None = None
    ) -> Iterator[tuple[int, bytes]]:
        """The message layer's JournalReader.read."""
        ...

    def end(self, journal: str) -> int:
        """The journal's current end offset (bytes appended so far)."""
        ...

    def load_position(self, journal: str, group: str) -> int | None:
        """The durable read position of `group` in `journal`, or None if it has none."""
        ...

    def store_position(self, journal: str, group: str, offset: int) -> None:
        """Durably record `offset` as `group`'s read position in `journal`."""
        ...
