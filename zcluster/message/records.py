"""Ready-made messages for the text framings, compatible with what Gazette producers write.

* JsonMessage: a JSON object whose ``"UUID"`` member holds the canonical UUID string (the encoding
  of a Go struct with a ``UUID message.UUID`` field).
* CsvRecord: a CSV record whose first field is the UUID string (Gazette's ``CSVRecord``).

Binary framings (protobuf-fixed) carry application-defined payloads; applications provide their
own message class implementing ``get_uuid``/``set_uuid``/``new_acknowledgement`` and ``to_bytes``.

Importing this module registers ``JsonMessage.from_json`` and ``CsvRecord.from_csv`` as the default
decode functions of their framings (readers given no ``decode`` use them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # no mypy installed: the decorator only speaks to mypyc, which compiles this module

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[type[Any]], type[Any]]:  # type: ignore[misc]
        return lambda cls: cls


from zcluster.message.framing import CONTENT_TYPE_CSV, CONTENT_TYPE_NDJSON, register_default_decode
from zcluster.message.uuid import ZERO_UUID, format_uuid, parse_uuid

__all__ = ["CsvRecord", "JsonMessage"]


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled by zcluster._native; applications subclass it
class JsonMessage:
    """A JSON object message. A missing UUID member reads as the all-zero UUID (never sequenced)."""

    __slots__ = ("_text", "_uuid", "doc")
    uuid_key: ClassVar[str] = "UUID"

    def __init__(self, doc: dict[str, Any] | None = None) -> None:
        self.doc: dict[str, Any] = {} if doc is None else doc
        # The UUID text last parsed and its bytes, reused while the doc still holds that very string (two
        # slots, not a tuple: one object fewer per message for the garbage collector to track).
        self._text: str | None = None
        self._uuid = ZERO_UUID

    @classmethod
    def from_json(cls, value: Any) -> JsonMessage:
        """Build from a decoded JSON value. Raises ValueError unless it is an object whose UUID
        member, if present, is a canonical UUID string."""
        if not isinstance(value, dict):
            raise ValueError(f"expected a JSON object, got {type(value).__name__}")
        u = value.get(cls.uuid_key)
        raw = ZERO_UUID
        if u is not None:
            if not isinstance(u, str):
                raise ValueError(f"{cls.uuid_key} must be a string")
            raw = parse_uuid(u)
        msg = cls(value)
        msg._text, msg._uuid = u, raw
        return msg

    def to_json(self) -> Any:
        return self.doc

    def get_uuid(self) -> bytes:
        u = self.doc.get(self.uuid_key)
        if u is None:
            return ZERO_UUID
        if u is self._text:  # identity: a doc edited since gets parsed again
            return self._uuid
        raw = self._uuid = parse_uuid(u)
        self._text = u
        return raw

    def set_uuid(self, uuid: bytes) -> None:
        text = format_uuid(uuid)
        self.doc[self.uuid_key] = text
        self._text, self._uuid = text, bytes(uuid)

    def new_acknowledgement(self, journal: str) -> JsonMessage:
        return type(self)()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JsonMessage) and self.doc == other.doc

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.doc!r})"


class CsvRecord:
    """A CSV record whose first field is the message UUID."""

    __slots__ = ("fields",)

    def __init__(self, fields: Sequence[str]) -> None:
        if not fields:
            raise ValueError("a CsvRecord needs at least the UUID field")
        self.fields = list(fields)

    @classmethod
    def from_csv(cls, fields: list[str]) -> CsvRecord:
        """Build from parsed fields. Raises ValueError if the first field is not a UUID string."""
        if not fields:
            raise ValueError("fields are empty")
        parse_uuid(fields[0])
        return cls(fields)

    def to_csv(self) -> list[str]:
        return self.fields

    def get_uuid(self) -> bytes:
        return parse_uuid(self.fields[0])

    def set_uuid(self, uuid: bytes) -> None:
        self.fields[0] = format_uuid(uuid)

    def new_acknowledgement(self, journal: str) -> CsvRecord:
        # Same width as this record: a CSV journal's field count is fixed by its first record.
        return type(self)([format_uuid(ZERO_UUID)] + [""] * (len(self.fields) - 1))

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as its constructor's argument: compiled (zcluster._native), an instance is never made bare.
        return (type(self), (self.fields,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CsvRecord) and self.fields == other.fields

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"CsvRecord({self.fields!r})"


register_default_decode(CONTENT_TYPE_NDJSON, JsonMessage.from_json)
register_default_decode(CONTENT_TYPE_CSV, CsvRecord.from_csv)
