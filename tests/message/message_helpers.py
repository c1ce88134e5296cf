from __future__ import annotations

from collections.abc import Callable

from zcluster.message import Envelope, Frame, build_uuid
from zcluster.message.framing import Decoded, Framing

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


def decode_all(framing: Framing, data: bytes, chunk: int, offset: int = 0) -> list[Decoded]:
    """Everything ``framing``'s decoder yields for ``data`` fed in pieces of ``chunk`` bytes, then closed."""
    d = framing.decoder(offset)
    out: list[Decoded] = []
    for i in range(0, len(data), chunk):
        out += d.feed(data[i : i + chunk])
    return out + d.close()


def summary(items: list[Decoded]) -> list[tuple[str, int, int, object]]:
    """(kind, begin, end, record) per decoded item, for comparisons."""
    return [(type(i).__name__, i.begin, i.end, i.record if isinstance(i, Frame) else None) for i in items]
