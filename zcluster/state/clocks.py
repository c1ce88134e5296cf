"""Exact ordering of 64-bit clocks inside Redis scores.

Redis scores are IEEE-754 doubles, exact for integers only below 2**53, and Gazette clocks use 64 bits.
Reinterpreting a clock's bit pattern as a double keeps both order and identity: for non-negative doubles
the bit patterns order exactly like the values, so ``a < b`` iff ``clock_to_score(a) < clock_to_score(b)``,
also inside Redis (ZADD/ZSCORE and Lua's ``tonumber`` round-trip every finite double exactly through the
17-digit decimal both sides print). Clocks at or above ``0x7FF0000000000000`` would be infinities or NaNs
and are refused; Gazette clocks reach that about 2**59 seconds after 1582.
"""

from __future__ import annotations

import struct

MAX_CLOCK = 0x7FF0000000000000 - 1
_Q = struct.Struct(">Q")
_D = struct.Struct(">d")


def clock_to_score(clock: int) -> float:
    """The double whose bit pattern is ``clock``; strictly monotonic over ``0 <= clock <= MAX_CLOCK``."""
    if not 0 <= clock <= MAX_CLOCK:
        raise ValueError(f"clock {clock:#x} is outside the range that maps to finite non-negative scores")
    return float(_D.unpack(_Q.pack(clock))[0])


def score_to_clock(score: float) -> int:
    """Inverse of :func:`clock_to_score`."""
    if not (score >= 0.0 and score <= _D.unpack(_Q.pack(MAX_CLOCK))[0]):
        raise ValueError(f"score {score!r} is not an encoded clock")
    return int(_Q.unpack(_D.pack(score))[0])
