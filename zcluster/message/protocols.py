"""What the message layer asks of a message (:class:`Message`) and of one that checks itself (:class:`Validator`).

Apart from :mod:`zcluster.message.envelope` (which names them too) because that module is compiled by
:mod:`zcluster._native`, and ``runtime_checkable`` needs an interpreted ``Protocol`` class.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Message", "Validator"]


@runtime_checkable
class Message(Protocol):
    def get_uuid(self) -> bytes:
        """The message's 16-byte UUID (the all-zero UUID if it has none)."""
        ...

    def set_uuid(self, uuid: bytes) -> None:
        """Store `uuid`; a Publisher calls this once the append order of the message is fixed."""
        ...

    def new_acknowledgement(self, journal: str) -> Message:
        """Return a fresh message of the kind `journal` holds, to carry an ACK_TXN UUID."""
        ...


@runtime_checkable
class Validator(Protocol):
    def validate(self) -> None:
        """Raise if the message must not be published."""
        ...
