"""Messages and envelopes.

A message is any object with a UUID; the layer asks nothing else of it, except that publishing (the
Producer) needs ``set_uuid`` and ``new_acknowledgement`` and calls ``validate()`` when a message has one. An
Envelope is a message read from a journal: where it came from (journal and byte range) plus its
16-byte UUID, taken once from the message so sequencing never calls back into message code.

The two protocols live in :mod:`zcluster.message.protocols` (this module is compiled by
:mod:`zcluster._native`, and a compiled class cannot be a runtime-checkable protocol); they are named here too.
"""

from __future__ import annotations

from typing import Any, Final

from zcluster.message.protocols import Message, Validator
from zcluster.message.uuid import Flags, ProducerID, get_clock, get_flags, get_producer_id

__all__ = ["Envelope", "Message", "Validator"]

_ACK_TXN: Final = int(Flags.ACK_TXN)  # Final: compiled (zcluster._native), a C static, not a dict lookup


class Envelope:
    """A message with its journal, byte range [begin, end) in that journal, and UUID.

    Envelopes compare equal when all five fields are equal. `is_ack` tells applications which
    delivered envelopes are ACK_TXN messages (delivered by read-committed readers, as in Gazette,
    and usually skipped by applications).

    `message` is typed Any on purpose: it is whatever the reader's decode function built (a
    :class:`Message` when the UUID is read from it), and applications use it as their own class.
    """

    __slots__ = ("begin", "end", "journal", "message", "uuid")

    def __init__(self, journal: str, begin: int, end: int, message: Any, uuid: bytes | None = None) -> None:
        self.journal = journal
        self.begin = begin
        self.end = end
        self.message = message
        if uuid is None:
            uuid = bytes(message.get_uuid())
        if len(uuid) != 16:
            raise ValueError(f"a UUID is 16 bytes, not {len(uuid)}")
        # Declared: compiled (zcluster._native), reading its bytes (is_ack, the Sequencer's clock and flags) is
        # then native, where an undeclared value (a message's get_uuid() is Any) takes generic operations.
        self.uuid: bytes = uuid

    @property
    def clock(self) -> int:
        return get_clock(self.uuid)

    @property
    def flags(self) -> int:
        return get_flags(self.uuid)

    @property
    def producer(self) -> ProducerID:
        return get_producer_id(self.uuid)

    @property
    def is_ack(self) -> bool:
        uuid = self.uuid
        return ((uuid[8] << 8) | uuid[9]) & 0x3FF == _ACK_TXN  # get_flags, inlined: asked of every message

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as its constructor's arguments: compiled (zcluster._native), an instance is never made bare.
        return (Envelope, (self.journal, self.begin, self.end, self.message, self.uuid))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Envelope):
            return NotImplemented
        return (self.journal, self.begin, self.end, self.uuid, self.message) == (
            other.journal,
            other.begin,
            other.end,
            other.uuid,
            other.message,
        )

    __hash__ = None  # type: ignore[assignment]  # Mutable message inside: not hashable.

    def __repr__(self) -> str:
        return f"Envelope({self.journal!r}, {self.begin}, {self.end}, {self.message!r}, uuid={self.uuid.hex()})"
