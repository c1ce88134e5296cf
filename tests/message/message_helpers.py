from __future__ import annotations

from collections.abc import Callable

from zcluster.message import Envelope, build_uuid

JOURNAL = "test/journal"

Gen = Callable[[bytes, int, int], Envelope]


def make_generator(journal: str = JOURNAL) -> Gen:
    """Gazette's test generator: envelopes of 100 bytes with 2 bytes of dead space between them."""
    offset = 0

    def generate(producer: bytes, clock: int, flags: int) -> Envelope:
        nonlocal offset
        env = Envelope(journal, offset, offset + 100, str(clock), build_uuid(producer, clock, flags))
        offset += 102
        return env

    return generate
