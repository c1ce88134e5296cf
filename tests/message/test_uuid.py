from __future__ import annotations

import itertools
import random
import struct
import threading
import uuid as std_uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from zcluster.message import (
    ZERO_UUID,
    Clock,
    Flags,
    build_uuid,
    clock_from_datetime,
    clock_from_unix_ns,
    clock_to_unix_ns,
    format_uuid,
    get_clock,
    get_flags,
    get_producer_id,
    new_producer_id,
    parse_uuid,
)

P = bytes([1, 2, 3, 4, 5, 6])


def unix(sec: int, nsec: int) -> int:
    return sec * 1_000_000_000 + nsec


def test_issue_acceptance_vector() -> None:
    u = build_uuid(P, 160, 1)
    assert format_uuid(u) == "0000000a-0000-1000-8001-010203040506"
    assert (get_clock(u), get_flags(u), get_producer_id(u)) == (160, 1, P)


def test_the_clock_is_read_from_the_rfc_4122_fields_of_any_16_bytes() -> None:
    """time_low << 4 | time_mid << 36 | time_hi's 12 bits << 52 | the counter (the clock sequence's bits 10-13),
    as Gazette's 64-bit arithmetic reads it: every byte at every value, and random UUIDs with every high bit."""
    layout = struct.Struct(">IHHH6s")

    def reference(u: bytes) -> int:
        lo, mid, hi, seq, _ = layout.unpack(u)
        return int((lo << 4) | (mid << 36) | ((hi & 0xFFF) << 52) | ((seq >> 10) & 0xF))

    rng = random.Random(14)
    cases = [bytes(i * [0] + [b] + (15 - i) * [0]) for i in range(16) for b in range(256)]
    cases += [rng.randbytes(16) for _ in range(20_000)] + [b"\xff" * 16]
    for u in cases:
        assert get_clock(u) == reference(u), u.hex()
    for size in (0, 15, 17):
        with pytest.raises(ValueError, match=f"a UUID is 16 bytes, not {size}"):
            get_clock(bytes(size))


@pytest.mark.parametrize(
    ("clock", "flags", "text"),
    [
        (0, 0, "00000000-0000-1000-8000-010203040506"),
        (1, 0, "00000000-0000-1000-8400-010203040506"),  # The counter sits above the flags.
        (0xF, 0x3FF, "00000000-0000-1000-bfff-010203040506"),
        (1 << 4, 2, "00000001-0000-1000-8002-010203040506"),
        (1 << 36, 0, "00000000-0001-1000-8000-010203040506"),
        (1 << 52, 0, "00000000-0000-1001-8000-010203040506"),
        ((1 << 64) - 1, 0, "ffffffff-ffff-1fff-bc00-010203040506"),
    ],
)
def test_layout_vectors(clock: int, flags: int, text: str) -> None:
    u = build_uuid(P, clock, flags)
    assert format_uuid(u) == text
    assert parse_uuid(text) == u
    assert get_clock(u) == clock and get_flags(u) == flags


def test_gazette_uuid_building_fixture() -> None:
    # Gazette's TestUUIDBuilding: a clock using the full bit range, ticked twice, flags 0b1010101010.
    producer = new_producer_id()
    clock = Clock.at(unix(1567304621, 981273734))
    clock.tick()
    clock.tick()
    u = build_uuid(producer, clock.value, 682)
    assert get_clock(u) == clock.value
    assert get_producer_id(u) == producer
    assert get_flags(u) == 682
    std = std_uuid.UUID(bytes=u)
    assert std.version == 1 and std.variant == std_uuid.RFC_4122
    assert std.node == int.from_bytes(producer, "big")
    assert std.time == clock.value >> 4
    # The stdlib's v1 time, converted back: original nanos rounded to 100 ns, plus two 1 µs ticks.
    assert clock_to_unix_ns(clock.value) == unix(1567304621, 981275700)


def test_version_bits_are_masked_when_decoding() -> None:
    u = build_uuid(P, (1 << 64) - 1, 0)
    assert get_clock(u) == (1 << 64) - 1
    assert u[6] >> 4 == 1  # Version 1 occupies the top nibble.


def test_producer_ids_are_random_with_multicast_bit() -> None:
    ids = {new_producer_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(p) == 6 and p[0] & 1 for p in ids)


def test_build_rejects_out_of_range_inputs() -> None:
    with pytest.raises(ValueError, match="10 low bits"):
        build_uuid(P, 1, 0x400)
    with pytest.raises(ValueError, match="64-bit"):
        build_uuid(P, 1 << 64, 0)
    with pytest.raises(ValueError, match="6 bytes"):
        build_uuid(b"12345", 1, 0)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0000000a00001000800101020304050",
        "0000000a-0000-1000-8001-01020304050g",
        "0000000a-0000-1000-8001-0102030405 6",
        "{0000000a-0000-1000-8001-010203040506}",
        "0000000a0-000-1000-8001-010203040506",  # 32 digits and 4 dashes, one of them misplaced
        "0000000a-0000-1000-80010-10203040506",
    ],
)
def test_parse_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError):
        parse_uuid(text)


def test_gazette_clock_rules() -> None:
    # Gazette's TestUUIDClock.
    clock = Clock()
    assert clock.tick() == 160  # One microsecond.
    assert clock.tick() == 320
    clock.update(unix(12, 300))
    assert clock.value == Clock.at(unix(12, 399)).value  # Precise to 100 ns.
    assert clock.as_unix_ns() == unix(12, 300)
    assert clock.value < Clock.at(unix(12, 400)).value
    assert clock.value > Clock.at(unix(12, 299)).value
    clock.tick()
    assert clock.as_unix_ns() == unix(12, 1300)
    assert Clock.at(unix(12, 1299)).value < clock.value < Clock.at(unix(12, 1400)).value
    clock.update(unix(11, 100))  # Never backwards.
    assert clock.as_unix_ns() == unix(12, 1300)
    clock.update(unix(12, 5000))  # The counter resets when the timestamp moves.
    assert clock.value == Clock.at(unix(12, 5000)).value
    assert clock.value & 0xF == 0


def test_clock_datetime_round_trip() -> None:
    t = datetime(2024, 2, 29, 12, 30, 45, 123456, tzinfo=UTC)
    c = Clock.at(t)
    assert c.as_datetime() == t
    assert clock_from_datetime(t.astimezone(timezone(timedelta(hours=5)))) == c.value
    assert c.value == clock_from_unix_ns(int(t.timestamp()) * 10**9 + 123456000)
    with pytest.raises(ValueError, match="timezone-aware"):
        Clock.at(datetime(2024, 1, 1))


def test_clock_rfc4122_epoch() -> None:
    assert clock_from_unix_ns(-122192928000000000 * 100) == 0
    with pytest.raises(ValueError):
        clock_from_unix_ns(-122192928000000000 * 100 - 100)


def test_tick_is_thread_safe() -> None:
    clock = Clock(0)
    seen: list[list[int]] = [[] for _ in range(4)]

    def run(out: list[int]) -> None:
        out.extend(clock.tick() for _ in range(5000))

    threads = [threading.Thread(target=run, args=(s,)) for s in seen]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    values = [v for s in seen for v in s]
    assert len(set(values)) == 20000
    assert clock.value == 20000 * 160
    assert all(a < b for s in seen for a, b in itertools.pairwise(s))


def test_flags_and_zero_uuid() -> None:
    assert (Flags.OUTSIDE_TXN, Flags.CONTINUE_TXN, Flags.ACK_TXN) == (0, 1, 2)
    assert get_clock(ZERO_UUID) == 0 and get_flags(ZERO_UUID) == 0
