"""On-disk layout of a file journal: fragment names and the open (not yet rolled) fragment's record format.

A journal directory holds:

* ``<begin>-<end>.frag``: a complete fragment holding the journal's bytes [begin, end) verbatim
  (offsets zero-padded to 20 digits, so name order is offset order). Written under a temporary hidden
  name and renamed into place once complete: a directory listing only ever shows whole fragments.
* ``.open``: the fragment being appended to, hidden from Spark and other file-source readers (names
  starting with ``.`` or ``_`` are ignored). It starts with a header (magic, begin offset, creation
  time) and holds one *record* per append: payload length and CRC-32, then the payload. A record is
  visible to readers only once whole and its CRC matches, so a writer crashing mid-append leaves a torn
  tail that no reader ever returns.
* ``_journal.json`` (labels and metadata), ``_lock`` (the append lock, ``fcntl.flock``),
  ``_positions/`` (consumer-group positions), ``_quarantine/`` (torn tails cut off by recovery).
"""

from __future__ import annotations

import re
import struct
import zlib
from typing import NamedTuple

__all__ = [
    "HEADER",
    "MAGIC",
    "META_NAME",
    "OPEN_NAME",
    "RECORD",
    "OpenHeader",
    "Record",
    "fragment_name",
    "pack_header",
    "pack_record",
    "parse_fragment_name",
    "scan_records",
    "unpack_header",
]

OPEN_NAME = ".open"
META_NAME = "_journal.json"
LOCK_NAME = "_lock"
POSITIONS_DIR = "_positions"
QUARANTINE_DIR = "_quarantine"
TMP_PREFIX = ".tmp-"

MAGIC = b"ZJOPEN1\x00"
HEADER = struct.Struct(">8sQd")  # magic, begin offset, creation time (Unix seconds)
RECORD = struct.Struct(">II")  # payload length, CRC-32 of the payload

_FRAGMENT = re.compile(r"(\d{20})-(\d{20})\.frag")


class OpenHeader(NamedTuple):
    begin: int
    created: float


class Record(NamedTuple):
    pos: int  # file position of the record's payload
    size: int  # payload length


def fragment_name(begin: int, end: int) -> str:
    return f"{begin:020d}-{end:020d}.frag"


def parse_fragment_name(name: str) -> tuple[int, int] | None:
    """(begin, end) of a fragment file name, or None if `name` is not a fragment."""
    m = _FRAGMENT.fullmatch(name)
    if m is None:
        return None
    begin, end = int(m[1]), int(m[2])
    return (begin, end) if begin < end else None


def pack_header(begin: int, created: float) -> bytes:
    return HEADER.pack(MAGIC, begin, created)


def unpack_header(data: bytes) -> OpenHeader | None:
    """The header at the start of `data`, or None if it is short or lacks the magic word."""
    if len(data) < HEADER.size:
        return None
    magic, begin, created = HEADER.unpack_from(data)
    return OpenHeader(begin, created) if magic == MAGIC else None


def pack_record(payload: bytes) -> bytes:
    return RECORD.pack(len(payload), zlib.crc32(payload)) + payload


def scan_records(buf: bytes | memoryview, base: int) -> tuple[list[Record], int]:
    """Split `buf` (file bytes starting at file position `base`) into whole, CRC-valid records.

    Returns the records and the number of bytes of `buf` they cover. Scanning stops at the first
    record that is incomplete or fails its CRC: bytes from there on are not (yet) a record.
    """
    out: list[Record] = []
    pos, n = 0, len(buf)
    hsize = RECORD.size
    while n - pos >= hsize:
        size, crc = RECORD.unpack_from(buf, pos)
        start = pos + hsize
        if n - start < size or zlib.crc32(buf[start : start + size]) != crc:
            break
        out.append(Record(base + start, size))
        pos = start + size
    return out, pos
