"""Gazette-compatible message UUIDs: RFC 4122 version-1 UUIDs carrying a producer, a clock and flags.

Layout (big-endian, 16 bytes), bit-for-bit as Gazette's ``message.BuildUUID``:

==========  ======================================================  =====================
bytes       content                                                 from
==========  ======================================================  =====================
0-3         time_low   = clock >> 4 (low 32 bits of the timestamp)  Clock
4-5         time_mid   = clock >> 36                                Clock
6-7         time_hi    = (clock >> 52) | 0x1000 (version 1)         Clock
8-9         clock_seq  = ((clock << 10) & 0x3c00) | flags | 0x8000  Clock counter, Flags
10-15       node       = producer id                                ProducerID
==========  ======================================================  =====================

A Clock is a 64-bit integer: its top 60 bits are an RFC 4122 timestamp (100 ns units since
1582-10-15) and its low 4 bits a counter. UUIDs are plain 16-byte ``bytes`` (``uuid.UUID(bytes=u)``
converts when needed); they are compared, hashed and decoded without creating objects, which keeps
the Sequencer's hot path cheap.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from enum import IntEnum
from typing import TYPE_CHECKING, Final, NewType

if TYPE_CHECKING:
    from mypy_extensions import i64  # a native 64-bit int once compiled (zcluster._native); an int otherwise

__all__ = [
    "G1582_NS100",
    "ZERO_UUID",
    "Clock",
    "Flags",
    "ProducerID",
    "build_uuid",
    "clock_from_datetime",
    "clock_from_unix_ns",
    "clock_span",
    "clock_to_datetime",
    "clock_to_unix_ns",
    "format_uuid",
    "get_clock",
    "get_flags",
    "get_producer_id",
    "new_producer_id",
    "parse_uuid",
]

ProducerID = NewType("ProducerID", bytes)
"""The 6-byte node field of a message UUID, identifying one producer (e.g. one Publisher)."""

G1582_NS100 = 122192928000000000
"""100 ns intervals between the RFC 4122 epoch (1582-10-15) and the Unix epoch (1970-01-01)."""

ZERO_UUID: Final = bytes(16)
"""The all-zero UUID. Messages carrying it (or any zero clock) opt out of sequencing."""

# Final: compiled (zcluster._native), a constant each, where a module global is a dict lookup at each use.
_MASK64: Final = (1 << 64) - 1
_MAX_FLAGS: Final = 0x3FF
_TICK: Final = 160  # One microsecond: 10 units of 100 ns, shifted past the 4-bit counter.
_LAYOUT = struct.Struct(">IHHH6s")
_pack = _LAYOUT.pack
_fromhex = bytes.fromhex


def _bytes16(text: str) -> bytes | None:
    """The 16 bytes of ``text`` when it is exactly a UUID's canonical form (36 characters, dashes at 8, 13,
    18 and 23, hex digits of either case elsewhere), else None. The reference of the compiled build's C
    twin (:mod:`zcluster.message._uuidhex`), and the path without it."""
    if len(text) != 36 or text[8:24:5] != "----":  # the dashes at 8, 13, 18 and 23, in one slice
        return None
    try:
        out = _fromhex(text.replace("-", ""))  # a stray dash elsewhere leaves too few digits: caught below
    except ValueError:
        return None
    return out if len(out) == 16 else None  # fromhex skips whitespace, so a space could hide a missing digit


def _fastest_bytes16() -> Callable[[str], bytes | None]:
    """Built with the compiled hot path (zcluster._native): the same in C, with no object but the result;
    without a build, over a stale one or under ZCLUSTER_PURE, the import fails and the reference stays."""
    try:
        from zcluster.message._uuidhex import bytes16 as native
    except ImportError:
        return _bytes16
    return native


bytes16: Final = _fastest_bytes16()  # Final: compiled (zcluster._native), a C static, not a dict lookup per use


class Flags(IntEnum):
    """Transaction semantics carried in the 10 low bits of the clock sequence.

    OUTSIDE_TXN: the message commits itself. CONTINUE_TXN: the message begins or continues a
    transaction and commits only when an ACK_TXN with a larger-or-equal clock follows. ACK_TXN:
    commits the producer's CONTINUE_TXN messages with clocks up to its own and rolls back those
    above it. Other 10-bit values are legal in a UUID; the Sequencer treats them as OUTSIDE_TXN.
    """

    OUTSIDE_TXN = 0x0
    CONTINUE_TXN = 0x1
    ACK_TXN = 0x2


def new_producer_id() -> ProducerID:
    """Return 6 cryptographically random bytes with the multicast bit (bit 0 of byte 0) set,
    which per RFC 4122 marks the node as not a real MAC address."""
    b = bytearray(os.urandom(6))
    b[0] |= 0x01
    return ProducerID(bytes(b))


def build_uuid(producer: bytes, clock: int, flags: int) -> bytes:
    """Build the 16-byte v1 UUID of `producer` (6 bytes), `clock` (0 <= clock < 2**64) and
    `flags` (0 <= flags <= 0x3ff). Raises ValueError if any is out of range.

    Round trip: get_clock, get_flags and get_producer_id return the inputs unchanged.
    """
    if not 0 <= flags <= _MAX_FLAGS:
        raise ValueError(f"flags {flags:#x}: only the 10 low bits may be used")
    if not 0 <= clock <= _MASK64:
        raise ValueError(f"clock {clock} is not a 64-bit unsigned value")
    if len(producer) != 6:
        raise ValueError(f"producer id must be 6 bytes, not {len(producer)}")
    return _pack(
        (clock >> 4) & 0xFFFFFFFF,
        (clock >> 36) & 0xFFFF,
        (clock >> 52) | 0x1000,
        ((clock << 10) & 0x3C00) | flags | 0x8000,
        producer,
    )


def get_clock(uuid: bytes) -> int:
    """Return the Clock (timestamp and 4-bit counter) of a 16-byte UUID.

    The version bits above the 60-bit timestamp are masked off, as Gazette's 64-bit arithmetic does.
    Raises ValueError unless ``uuid`` is 16 bytes.
    """
    if len(uuid) != 16:
        raise ValueError(f"a UUID is 16 bytes, not {len(uuid)}")
    # Byte by byte rather than struct's unpack: compiled (zcluster._native), native integer math and no tuple
    # per call (the Sequencer asks once per message). time_low << 4, time_mid << 36, time_hi (12 bits) << 52
    # and the counter: the clock sequence's 4 bits above its 10 flag bits. In i64s (plain ints uncompiled): a
    # tagged int's shift checks for overflow at each step. The top 4 bits (<< 60) fit one when below 8.
    b0: i64 = uuid[0]
    b1: i64 = uuid[1]
    b2: i64 = uuid[2]
    b3: i64 = uuid[3]
    b4: i64 = uuid[4]
    b5: i64 = uuid[5]
    b7: i64 = uuid[7]
    b8: i64 = uuid[8]
    low: i64 = (
        (b0 << 28) | (b1 << 20) | (b2 << 12) | (b3 << 4) | (b4 << 44) | (b5 << 36) | (b7 << 52) | ((b8 >> 2) & 0xF)
    )
    top: i64 = uuid[6] & 0x0F
    if top < 8:
        return low | (top << 60)
    return int(low) | (int(top) << 60)


def get_flags(uuid: bytes) -> int:
    """Return the 10 flag bits of a 16-byte UUID (compare with Flags members)."""
    return ((uuid[8] << 8) | uuid[9]) & _MAX_FLAGS


def get_producer_id(uuid: bytes) -> ProducerID:
    """Return the 6-byte node (producer id) of a 16-byte UUID."""
    return ProducerID(uuid[10:16])


def format_uuid(uuid: bytes) -> str:
    """Return the canonical 36-character lower-case text form, e.g. 0000000a-0000-1000-8001-010203040506."""
    h = uuid.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def parse_uuid(text: str) -> bytes:
    """Parse the canonical 36-character text form (any case). Raises ValueError otherwise."""
    out = bytes16(text)
    if out is None:
        raise ValueError(f"invalid UUID {text!r}")
    return out


def clock_from_unix_ns(ns: int) -> int:
    """Return the Clock of a Unix time in nanoseconds, truncated to 100 ns, counter zero.

    Truncation is toward zero, as Go's integer division, so pre-1970 times match Gazette too.
    Raises ValueError for times before 1582-10-15 or beyond the 60-bit timestamp.
    """
    units = ns // 100 if ns >= 0 else -((-ns) // 100)
    ts = units + G1582_NS100
    if not 0 <= ts < (1 << 60):
        raise ValueError(f"unix time {ns} ns is outside the RFC 4122 timestamp range")
    return ts << 4


def clock_span(seconds: float) -> int:
    """Return the Clock difference covering `seconds` (rounded to 100 ns; the counter bits are zero).

    ``clock_from_unix_ns(t) - clock_span(s)`` is the clock `s` seconds before `t`, e.g. a prune horizon.
    Raises ValueError for a negative or non-finite number of seconds.
    """
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"a clock span needs a finite, non-negative number of seconds, not {seconds!r}")
    return round(seconds * 10_000_000) << 4


def clock_to_unix_ns(clock: int) -> int:
    """Return the Unix time in nanoseconds of a Clock's timestamp (the counter is ignored)."""
    return ((clock >> 4) - G1582_NS100) * 100


def clock_from_datetime(t: datetime) -> int:
    """Return the Clock of a timezone-aware datetime (microsecond precision). Raises ValueError if naive."""
    if t.tzinfo is None:
        raise ValueError("clock_from_datetime needs a timezone-aware datetime")
    delta = t - datetime(1970, 1, 1, tzinfo=UTC)
    us = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return clock_from_unix_ns(us * 1000)


def clock_to_datetime(clock: int) -> datetime:
    """Return the UTC datetime of a Clock's timestamp, truncated to microseconds."""
    ns = clock_to_unix_ns(clock)
    return datetime.fromtimestamp(ns // 1_000_000_000, UTC).replace(microsecond=(ns % 1_000_000_000) // 1000)


class Clock:
    """A monotonic 64-bit Gazette clock, safe for concurrent use.

    ``update(t)`` raises the clock to the timestamp of `t` (with a zero counter) and never lowers it;
    ``tick()`` advances it by one microsecond (160 units: Gazette's current behaviour) and returns
    the new value. Every value returned by ``tick()`` is distinct and larger than any earlier one.
    """

    __slots__ = ("_lock", "_value")

    def __init__(self, value: int = 0) -> None:
        if not 0 <= value <= _MASK64:
            raise ValueError(f"clock {value} is not a 64-bit unsigned value")
        self._value = value
        self._lock = threading.Lock()

    @classmethod
    def at(cls, t: datetime | int) -> Clock:
        """Return a Clock set to `t`: an aware datetime, or a Unix time in integer nanoseconds."""
        c = cls()
        c.update(t)
        return c

    @property
    def value(self) -> int:
        return self._value

    def update(self, t: datetime | int) -> None:
        """Raise the clock to `t` (aware datetime or Unix nanoseconds) unless it is already at or past it."""
        nxt = clock_from_datetime(t) if isinstance(t, datetime) else clock_from_unix_ns(t)
        with self._lock:
            if nxt > self._value:
                self._value = nxt

    def tick(self) -> int:
        """Advance by one microsecond and return the new value (wrapping at 2**64, as Go's uint64)."""
        with self._lock:
            self._value = v = (self._value + _TICK) & _MASK64
        return v

    def as_unix_ns(self) -> int:
        return clock_to_unix_ns(self._value)

    def as_datetime(self) -> datetime:
        return clock_to_datetime(self._value)

    def __int__(self) -> int:
        return self._value

    def __repr__(self) -> str:
        return f"Clock({self._value})"
