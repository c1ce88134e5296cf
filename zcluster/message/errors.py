"""The message layer's errors, under its own root :class:`MessageError` (see :mod:`zcluster.errors`).

They live here, in one module that imports only :mod:`zcluster.errors`, so every module of the layer can
raise them without importing another. Each is also importable from the module that raises it and from
:mod:`zcluster.message`. Errors that have a natural built-in meaning keep it as a second base
(``except LookupError`` still catches an unknown journal).
"""

from __future__ import annotations

from typing import Any

from zcluster.errors import ZClusterError

__all__ = [
    "DecodeError",
    "DesyncError",
    "EmptyPartitionsError",
    "FramingError",
    "JournalError",
    "JournalExistsError",
    "JournalListError",
    "JournalNotFoundError",
    "MessageError",
    "OffsetOutOfRangeError",
    "ReplayError",
    "ReplayRequiredError",
    "SelectorError",
    "SequencerError",
    "UnexpectedEndError",
    "UnknownContentTypeError",
]


class MessageError(ZClusterError):
    """Base class of every error the message layer raises on purpose."""


# -- framing ---------------------------------------------------------------------------------------


class FramingError(MessageError):
    """Bytes [begin, end) of the stream could not be decoded into a frame."""

    def __init__(self, begin: int, end: int, reason: str) -> None:
        super().__init__(f"{reason} (bytes {begin}..{end})")
        self.begin = begin
        self.end = end
        self.reason = reason


class DecodeError(FramingError):
    """A complete frame whose content is malformed; exactly that frame was consumed."""


class DesyncError(FramingError):
    """Bytes that are not a frame were skipped, up to the next frame boundary."""


class UnexpectedEndError(FramingError):
    """The stream ended in the middle of a frame."""


class UnknownContentTypeError(MessageError, LookupError):
    """No Framing is registered for a content type."""


class FrameTooLargeError(MessageError, ValueError):
    """A message marshals to a frame larger than its framing's ``max_frame_bytes``; nothing was appended
    (readers would refuse the frame: see the framing module)."""


# -- selectors and mappings ------------------------------------------------------------------------


class SelectorError(MessageError, ValueError):
    """A selector string is malformed. The message names the offending position and text."""


class EmptyPartitionsError(MessageError, LookupError):
    """No journal currently matches the mapping's partitions (Gazette: ErrEmptyListResponse)."""


# -- journals --------------------------------------------------------------------------------------


class JournalError(MessageError):
    """Base class of errors raised by journal implementations."""


class JournalNotFoundError(JournalError, LookupError):
    """The named journal does not exist."""


class JournalExistsError(JournalError, ValueError):
    """A journal of that name already exists (or its name collides with an existing journal's path)."""


class JournalListError(JournalError):
    """Listing journals met directories it could not read (e.g. no permission): ``unreadable`` maps each
    one's path under the store's root (a journal's name, when the directory is a journal) to the OSError;
    ``listed`` holds the journals that could be listed and match (a caller may go on with those, but must
    not take them for every journal)."""

    def __init__(self, message: str, unreadable: dict[str, OSError], listed: list[Any]) -> None:
        super().__init__(message)
        self.unreadable = unreadable
        self.listed = listed


class OffsetOutOfRangeError(JournalError, ValueError):
    """A read offset is negative or beyond the journal's current end, or lies in bytes the journal lost.

    For a *lost range* (bytes that were appended but can no longer be read: a damaged file journal
    fragment) the error says which: ``journal``, ``lost_begin`` and ``lost_end`` (the range [begin, end)),
    ``resume_offset`` (where reading can go on: the range's end) and ``reason`` (what the journal recorded
    about it). They are None for the other cases (an offset outside the journal)."""

    def __init__(
        self,
        message: str,
        *,
        journal: str | None = None,
        lost_begin: int | None = None,
        lost_end: int | None = None,
        resume_offset: int | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.journal = journal
        self.lost_begin, self.lost_end = lost_begin, lost_end
        self.resume_offset = resume_offset
        self.reason = reason

    @property
    def lost(self) -> tuple[int, int] | None:
        """The lost range ``(lost_begin, lost_end)``, or None when the error is not about one."""
        if self.lost_begin is None or self.lost_end is None:
            return None
        return (self.lost_begin, self.lost_end)


# -- sequencing ------------------------------------------------------------------------------------


class SequencerError(MessageError):
    """The Sequencer was used out of order (a programming error in the caller), or its replay failed."""


class ReplayRequiredError(SequencerError):
    """``step()`` was called after ACK_COMMIT_REPLAY without ``start_replay()``."""


class ReplayError(SequencerError):
    """The replay iterator failed or yielded an envelope outside the requested range.
    The Sequencer is unchanged by the bad envelope; the caller may start a correct replay."""
