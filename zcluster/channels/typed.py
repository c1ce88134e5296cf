"""Typed messages: a registry of message kinds, a marshaller that records the kind, typed reading.

A *kind* is (group, name) plus a category (command or event), registered with a Python type. On the wire
(ndjson framing) a typed message is one JSON object::

    {"UUID": "...", "group": "orders", "kind": "OrderPlaced", "category": "event", "payload": {...}}

Payloads: a dataclass is written with ``dataclasses.asdict`` and rebuilt with ``cls(**payload)``; any
other registered class provides ``to_payload()`` and a classmethod ``from_payload(payload)``. An object
with neither ``group`` nor ``kind`` whose UUID carries the ACK_TXN flag is a transaction's acknowledgement
(``kind`` and ``error`` None; readers and the dispatcher skip it).

Decoding never fails on a well-formed JSON object: an unknown kind, a record that names no kind (``group``
or ``kind`` absent, and not an ACK; with or without a UUID), or a payload the type rejects yields a
:class:`TypedMessage` whose ``error`` says why, so its UUID still reaches the Sequencer (transactions stay
correct). :class:`TypedReader` then raises :class:`zcluster.UnknownKindError` (a kind not registered) or
:class:`zcluster.UndecodableMessageError` (no kind, or a payload rejected) carrying the envelope, and stays
usable: the next ``next()`` continues after that message. Both errors are defined in :mod:`zcluster.errors`
(the one error tree) and exported from :mod:`zcluster` and, for convenience, from :mod:`zcluster.channels`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterator
from typing import Any

from zcluster.errors import UndecodableMessageError, UnknownKindError
from zcluster.message.envelope import Envelope
from zcluster.message.uuid import ZERO_UUID, Flags, format_uuid, get_flags, parse_uuid

__all__ = [
    "Category",
    "Kind",
    "KindRegistry",
    "TypedMessage",
    "TypedReader",
    "check",
]


class Category(enum.Enum):
    COMMAND = "command"
    EVENT = "event"


@dataclasses.dataclass(frozen=True)
class Kind:
    """A message kind: its group, name and category."""

    group: str
    name: str
    category: Category

    def __str__(self) -> str:
        return f"{self.group}/{self.name}"


class TypedMessage:
    """A framed typed message: its kind, body (an instance of the kind's type) and UUID.

    Implements the message layer's Message protocol and ``to_json`` (ndjson framing). For a message read
    with an unknown kind or a bad payload, `body` is the raw payload and `error` says what went wrong.
    """

    __slots__ = ("body", "error", "kind", "uuid")

    def __init__(self, kind: Kind | None, body: Any, uuid: bytes = ZERO_UUID, error: str | None = None) -> None:
        self.kind = kind
        self.body = body
        self.uuid = uuid
        self.error = error

    def get_uuid(self) -> bytes:
        return self.uuid

    def set_uuid(self, uuid: bytes) -> None:
        self.uuid = uuid

    def new_acknowledgement(self, journal: str) -> TypedMessage:
        return TypedMessage(None, None)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"UUID": format_uuid(self.uuid)}
        if self.kind is not None:
            doc.update(
                group=self.kind.group,
                kind=self.kind.name,
                category=self.kind.category.value,
                payload=_to_payload(self.body),
            )
        return doc

    def __repr__(self) -> str:
        return f"TypedMessage({self.kind}, {self.body!r}, uuid={self.uuid.hex()}, error={self.error!r})"


def _to_payload(body: Any) -> Any:
    if dataclasses.is_dataclass(body) and not isinstance(body, type):
        return dataclasses.asdict(body)
    return body.to_payload()


class KindRegistry:
    """Maps kinds to Python types and back. A type is registered under one kind only, and vice versa."""

    def __init__(self) -> None:
        self._types: dict[tuple[str, str], tuple[Kind, type]] = {}
        self._kinds: dict[type, Kind] = {}

    def register(self, group: str, name: str, cls: type, category: Category = Category.EVENT) -> Kind:
        """Register `cls` as kind (group, name). ValueError if either is already registered; TypeError if
        `cls` is neither a dataclass nor has ``to_payload``/``from_payload``."""
        if not group or not name:
            raise ValueError("a kind needs a non-empty group and name")
        if not dataclasses.is_dataclass(cls) and not (hasattr(cls, "to_payload") and hasattr(cls, "from_payload")):
            raise TypeError(f"{cls.__qualname__} must be a dataclass or define to_payload() and from_payload()")
        if (group, name) in self._types:
            raise ValueError(f"kind {group}/{name} is already registered to {self._types[group, name][1].__qualname__}")
        if cls in self._kinds:
            raise ValueError(f"{cls.__qualname__} is already registered as kind {self._kinds[cls]}")
        kind = Kind(group, name, category)
        self._types[group, name] = (kind, cls)
        self._kinds[cls] = kind
        return kind

    def command(self, group: str, name: str | None = None) -> Callable[[type], type]:
        """Class decorator registering a command kind (name defaults to the class name)."""
        return lambda cls: self._decorate(group, name, cls, Category.COMMAND)

    def event(self, group: str, name: str | None = None) -> Callable[[type], type]:
        """Class decorator registering an event kind (name defaults to the class name)."""
        return lambda cls: self._decorate(group, name, cls, Category.EVENT)

    def _decorate(self, group: str, name: str | None, cls: type, category: Category) -> type:
        self.register(group, name or cls.__name__, cls, category)
        return cls

    def kind_of(self, obj_or_cls: object) -> Kind:
        """The kind of a registered type or of an instance of one; LookupError otherwise."""
        cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
        try:
            return self._kinds[cls]
        except KeyError:
            raise LookupError(f"{cls.__qualname__} is not a registered message type") from None

    def wrap(self, body: Any) -> TypedMessage:
        """A TypedMessage carrying `body` under its registered kind (ready to publish)."""
        return TypedMessage(self.kind_of(body), body)

    def decode(self, record: Any) -> TypedMessage:
        """Build a TypedMessage from an ndjson record (a decode function for the message layer's readers).

        ValueError only if `record` is not a JSON object or its UUID is malformed; unknown or absent kinds
        (ACKs excepted) and bad payloads are returned with ``error`` set (see the module docstring)."""
        if not isinstance(record, dict):
            raise ValueError(f"expected a JSON object, got {type(record).__name__}")
        u = record.get("UUID")
        uuid = ZERO_UUID if u is None else parse_uuid(u)
        group, name = record.get("group"), record.get("kind")
        if not _names_kind(record):
            if group is None and name is None and get_flags(uuid) == Flags.ACK_TXN:
                return TypedMessage(None, None, uuid)  # a transaction's ACK: delivered, then skipped
            # Nothing to pick a handler by: an error, so that readers raise and the pool dead-letters it.
            return TypedMessage(None, record, uuid, f"record names no message kind (group {group!r}, kind {name!r})")
        payload = record.get("payload")
        entry = self._types.get((str(group), str(name)))
        if entry is None:
            return TypedMessage(None, record, uuid, f"unknown message kind {group}/{name}")
        kind, cls = entry
        try:
            if dataclasses.is_dataclass(cls):
                if not isinstance(payload, dict):
                    raise TypeError(f"payload is {type(payload).__name__}, not an object")
                body = cls(**payload)
            else:
                body = cls.from_payload(payload)  # type: ignore[attr-defined]
        except (TypeError, ValueError) as exc:
            return TypedMessage(kind, payload, uuid, f"payload of {kind} does not fit {cls.__qualname__}: {exc}")
        return TypedMessage(kind, body, uuid)


def _names_kind(record: Any) -> bool:
    return isinstance(record, dict) and record.get("group") is not None and record.get("kind") is not None


def check(env: Envelope) -> Envelope:
    """Return `env` if its TypedMessage decoded cleanly. Raise UnknownKindError if it names a kind that is
    not registered, UndecodableMessageError if it names none (and is not an ACK) or its payload does not fit."""
    msg = env.message
    if isinstance(msg, TypedMessage) and msg.error is not None:
        if msg.kind is None and _names_kind(msg.body):
            raise UnknownKindError(env, msg.error)
        raise UndecodableMessageError(env, msg.error)
    return env


class TypedReader:
    """Wraps an iterator of envelopes read with ``decode=registry.decode`` (ReadCommittedIter or
    ReadUncommittedIter): yields the envelopes of typed messages and raises UnknownKindError /
    UndecodableMessageError for bad ones (a record naming no kind among them), staying usable. With
    `skip_untyped`, transaction ACKs are skipped; otherwise they are yielded (``message.kind`` None)."""

    def __init__(self, envelopes: Iterator[Envelope], *, skip_untyped: bool = True) -> None:
        self._it = envelopes
        self._skip = skip_untyped

    def __iter__(self) -> TypedReader:
        return self

    def __next__(self) -> Envelope:
        while True:
            env = next(self._it)
            msg = env.message
            if self._skip and isinstance(msg, TypedMessage) and msg.kind is None and msg.error is None:
                continue
            return check(env)
