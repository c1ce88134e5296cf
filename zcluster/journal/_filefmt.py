"""On-disk layout of a file journal: fragment names and the open (not yet rolled) fragment's record format.

A journal directory holds:

* ``<begin>-<end>-<crc>.frag``: a complete fragment holding the journal's bytes [begin, end) verbatim
  (offsets zero-padded to 20 digits, so name order is offset order; ``crc``: the CRC-32 of those bytes, 8
  hex digits). Written under a temporary hidden name and renamed into place once complete: a directory
  listing only ever shows whole fragments. The checksum is in the name, as Gazette names fragments by
  their content's: it appears atomically with the bytes (one rename), needs no second file that could be
  lost apart from them, and leaves the bytes verbatim for Spark and other file-source readers (a header
  or trailer would not). Fragments written before checksums (``<begin>-<end>.frag``) are read as they
  are: nothing can check their bytes.
* ``.open``: the fragment being appended to, hidden from Spark and other file-source readers (names
  starting with ``.`` or ``_`` are ignored). It starts with a header (magic, begin offset, creation
  time) and holds one *record* per append: payload length and CRC-32, then the payload. A record is
  visible to readers only once whole and its CRC matches, so a writer crashing mid-append leaves a torn
  tail that no reader ever returns.
* ``_lost-<begin>-<end>``: a *lost range*: journal bytes [begin, end) that were appended but can no longer
  be read (a damaged record of the open fragment, a fragment file found short or failing its checksum, a
  fragment file missing: a gap between the sealed pieces). Its bytes, as far as they
  survive, are in ``_quarantine/`` (the marker, a small JSON document, names the file). Together the
  fragments and lost ranges cover the journal from offset 0 without holes, so offsets are never reused.
* ``_journal.json`` (labels, metadata, the identity ``uid``), ``_lock`` (the append lock, ``fcntl.flock``),
  ``_positions/`` (consumer-group positions), ``_quarantine/`` (torn tails and damaged bytes moved aside).

Damage in the open fragment (:func:`plan_damage`): records carry their length and CRC-32, so a record
whose CRC fails is skipped by its length when a valid record follows there; if the length itself is
damaged, the next position where two valid records (or a valid one and the end of the file) follow each
other is taken, and the damaged bytes' journal size is what the record lengths say, or, when they cannot
be read, that of a single record over all the damaged bytes. That is exact when one record is damaged;
when the headers of several consecutive records are destroyed the format cannot tell how many there
were, and this upper bound shifts the offsets of the records after them by 8 bytes per extra header (new
appends still never reuse an offset; the lost range's marker says its size is estimated). A *whole*
record (its length fits in the file) was appended, so its journal offsets stay taken even when its CRC
fails; an incomplete record at the end of the file is a torn append (the append never returned), whose
offsets may be used again. A damaged length in the last record that claims more bytes than the file
holds therefore reads as a torn append.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from collections.abc import Callable
from typing import NamedTuple

__all__ = [
    "HEADER",
    "MAGIC",
    "META_NAME",
    "OPEN_NAME",
    "RECORD",
    "OpenHeader",
    "Record",
    "Scan",
    "Span",
    "find_fragment",
    "fragment_name",
    "lost_name",
    "pack_header",
    "pack_record",
    "parse_fragment_name",
    "parse_lost_name",
    "plan_damage",
    "scan_at",
    "scan_payloads",
    "scan_records",
    "unpack_header",
]

OPEN_NAME = ".open"
META_NAME = "_journal.json"
LOCK_NAME = "_lock"
POSITIONS_DIR = "_positions"
QUARANTINE_DIR = "_quarantine"
TMP_PREFIX = ".tmp-"
LOST_PREFIX = "_lost-"

MAGIC = b"ZJOPEN1\x00"
try:  # built with the compiled hot path (zcluster._native): the records scanned in C
    from zcluster.journal import _scan
except ImportError:  # no build, a stale one, or ZCLUSTER_PURE
    _scan = None  # type: ignore[assignment]

HEADER = struct.Struct(">8sQd")  # magic, begin offset, creation time (Unix seconds)
RECORD = struct.Struct(">II")  # payload length, CRC-32 of the payload
_UNPACK_RECORD = RECORD.unpack_from

_FRAGMENT = re.compile(r"(\d{20})-(\d{20})(?:-([0-9a-f]{8}))?\.frag")
_LOST = re.compile(r"_lost-(\d{20})-(\d{20})")


class OpenHeader(NamedTuple):
    begin: int
    created: float


class Record(NamedTuple):
    pos: int  # file position of the record's payload
    size: int  # payload length


Read = Callable[[int, int], bytes]
"""``read(n, pos)``: up to n bytes of the open fragment file from position pos (``os.pread``)."""


def fragment_name(begin: int, end: int, crc: int | None = None) -> str:
    """The name of the fragment file of bytes [begin, end) whose CRC-32 is `crc` (None: the name of a
    fragment written before checksums)."""
    return f"{begin:020d}-{end:020d}.frag" if crc is None else f"{begin:020d}-{end:020d}-{crc:08x}.frag"


def parse_fragment_name(name: str) -> tuple[int, int, int | None] | None:
    """(begin, end, CRC-32 of the bytes or None when the name has none) of a fragment file name, or None
    if `name` is not a fragment."""
    m = _FRAGMENT.fullmatch(name)
    if m is None:
        return None
    begin, end = int(m[1]), int(m[2])
    return (begin, end, None if m[3] is None else int(m[3], 16)) if begin < end else None


def find_fragment(directory: os.PathLike[str] | str, begin: int, end: int) -> str:
    """The name of the fragment file of bytes [begin, end) in `directory`, with or without a checksum
    (FileNotFoundError if there is none)."""
    for name in os.listdir(directory):
        r = parse_fragment_name(name)
        if r is not None and r[:2] == (begin, end):
            return name
    raise FileNotFoundError(f"no fragment file of bytes {begin}..{end} in {directory}")


def lost_name(begin: int, end: int) -> str:
    return f"{LOST_PREFIX}{begin:020d}-{end:020d}"


def parse_lost_name(name: str) -> tuple[int, int] | None:
    """(begin, end) of a lost-range marker's name, or None if `name` is not one."""
    m = _LOST.fullmatch(name)
    if m is None:
        return None
    begin, end = int(m[1]), int(m[2])
    return (begin, end) if begin < end else None


def pack_header(begin: int, created: float) -> bytes:
    return HEADER.pack(MAGIC, begin, created)


def unpack_header(data: bytes, *, lenient: bool = False) -> OpenHeader | None:
    """The header at the start of `data`, or None if it is short or lacks the magic word (`lenient`: read
    the begin offset and creation time even without the magic word)."""
    if len(data) < HEADER.size:
        return None
    magic, begin, created = HEADER.unpack_from(data)
    return OpenHeader(begin, created) if magic == MAGIC or lenient else None


def pack_record(payload: bytes) -> bytes:
    return RECORD.pack(len(payload), zlib.crc32(payload)) + payload


class Scan(NamedTuple):
    """What :func:`scan_payloads` found at the start of a buffer: `records` whole, CRC-valid records, covering
    its first `used` bytes, and their payloads end to end (None when not collected; bytes from the compiled
    build's scan, a bytearray from the pure one)."""

    records: int
    used: int
    payload: bytes | bytearray | None

    @property
    def size(self) -> int:
        """The journal bytes the records hold."""
        return self.used - RECORD.size * self.records


def scan_payloads(buf: bytes | memoryview, collect: bool = True) -> Scan:
    """Split `buf` (file bytes starting at a record boundary) into whole, CRC-valid records, in one pass,
    concatenating their payloads if `collect` (no Python object is kept per record).

    Scanning stops at the first record that is incomplete or fails its CRC: bytes from there on are not
    (yet) a record. An empty record is never written (empty appends write nothing), so one is damage (e.g.
    zeroed bytes). The same records as :func:`scan_records` finds, faster: this is the hot loop of every
    scan of an open fragment. With the compiled build it runs in C (:mod:`zcluster.journal._scan`, no Python
    object per record); :func:`_scan_payloads` is the reference, and the path without it.
    """
    if _scan is not None:
        records, used, payloads = _scan.scan_payloads(buf, collect)
        return Scan(records, used, payloads)
    return _scan_payloads(buf, collect)


def _scan_payloads(buf: bytes | memoryview, collect: bool) -> Scan:
    """:func:`scan_payloads` in Python: one unpack, one slice and one CRC per record."""
    view = memoryview(buf)
    data = buf if isinstance(buf, bytes) else view  # unpacking from bytes is a little cheaper
    unpack, crc32, hsize = _UNPACK_RECORD, zlib.crc32, RECORD.size
    pos, n, records = 0, len(view), 0
    last = n - hsize
    if not collect:
        while pos <= last:
            size, crc = unpack(data, pos)
            start = pos + hsize
            end = start + size
            if end > n or not size or crc32(view[start:end]) != crc:
                break
            records += 1
            pos = end
        return Scan(records, pos, None)
    out = bytearray()
    while pos <= last:
        size, crc = unpack(data, pos)
        start = pos + hsize
        end = start + size
        if end > n or not size:
            break
        payload = view[start:end]
        if crc32(payload) != crc:
            break
        out += payload
        records += 1
        pos = end
    return Scan(records, pos, out)


def scan_at(read: Read, pos: int, n: int, limit: int, collect: bool = True) -> Scan:
    """:func:`scan_payloads` over ``read(n, pos)``; when no whole valid record is in those bytes but the
    first record's header is, the whole first record is read instead if it ends by file position `limit`
    (a record larger than `n`)."""
    buf = read(n, pos)
    scan = scan_payloads(buf, collect)
    if not scan.records and len(buf) >= RECORD.size:
        need = RECORD.size + _UNPACK_RECORD(buf)[0]
        if pos + need <= limit:
            scan = scan_payloads(read(need, pos), collect)
    return scan


def scan_records(buf: bytes | memoryview, base: int) -> tuple[list[Record], int]:
    """Split `buf` (file bytes starting at file position `base`) into whole, CRC-valid records.

    Returns the records and the number of bytes of `buf` they cover. Scanning stops at the first
    record that is incomplete or fails its CRC: bytes from there on are not (yet) a record. An empty
    record is never written (empty appends write nothing), so one is damage (e.g. zeroed bytes).
    """
    out: list[Record] = []
    pos, n = 0, len(buf)
    hsize = RECORD.size
    while n - pos >= hsize:
        size, crc = RECORD.unpack_from(buf, pos)
        start = pos + hsize
        if n - start < size or not size or zlib.crc32(buf[start : start + size]) != crc:
            break
        out.append(Record(base + start, size))
        pos = start + size
    return out, pos


# -- damage ------------------------------------------------------------------------------------------------

GOOD, LOST, TORN = "good", "lost", "torn"
_WINDOW = 1 << 20


class Span(NamedTuple):
    """File bytes [fbegin, fend) of the open fragment, holding journal bytes [jbegin, jend): valid records
    (GOOD), damaged bytes once appended (LOST), or a torn append at the end of the file (TORN; its
    offsets were never handed out, so jbegin == jend). `estimated`: a LOST span whose record headers are
    unreadable, so its journal size is that of one record over all its bytes (the most it can be)."""

    kind: str
    fbegin: int
    fend: int
    jbegin: int
    jend: int
    estimated: bool = False


def _crc(read: Read, pos: int, n: int) -> int:
    crc = 0
    while n > 0:
        data = read(min(n, _WINDOW), pos)
        if not data:
            return -1
        crc = zlib.crc32(data, crc)
        pos, n = pos + len(data), n - len(data)
    return crc


def _record_at(read: Read, pos: int, size: int) -> tuple[int, bool] | None:
    """(length, CRC matches) of the record at file position `pos`, or None if it does not fit in the file."""
    if size - pos < RECORD.size:
        return None
    length, crc = RECORD.unpack(read(RECORD.size, pos))
    if pos + RECORD.size + length > size:
        return None
    return length, length > 0 and _crc(read, pos + RECORD.size, length) == crc


def _anchored(read: Read, pos: int, size: int) -> bool:
    """Whether a valid record starts at `pos` and is followed by the end of the file, a valid
    record or a torn tail (a chance match inside damaged bytes is then all but impossible)."""
    rec = _record_at(read, pos, size)
    if rec is None or not rec[1]:
        return False
    nxt = pos + RECORD.size + rec[0]
    if nxt == size:
        return True
    after = _record_at(read, nxt, size)
    return after is None or after[1]


def _resync(read: Read, pos: int, size: int, rec: tuple[int, bool] | None) -> int:
    """The file position of the first trustworthy record after the bad one at `pos`, or -1."""
    if rec is not None:  # whole but failing its CRC: its length most likely holds
        nxt = pos + RECORD.size + rec[0]
        if nxt < size and _anchored(read, nxt, size):
            return nxt
    q = pos + 1
    while q + RECORD.size < size:
        win = read(min(_WINDOW, size - q), q)
        n = len(win) - RECORD.size + 1  # candidate headers lying whole in the window
        zero_first = size - q - RECORD.size < 1 << 24  # a length that fits then starts with a zero byte
        i = 0
        while 0 <= i < n:
            if zero_first and (i := win.find(b"\0", i, n)) < 0:
                break
            length = int.from_bytes(win[i : i + 4], "big")
            if 1 <= length <= size - q - i - RECORD.size and _anchored(read, q + i, size):
                return q + i
            i += 1
        q += max(n, 1)
    return -1


def _valid_run(read: Read, pos: int, size: int) -> tuple[int, int]:
    """(file position, journal bytes) reached by walking valid records from `pos`."""
    total = 0
    while pos < size:
        scan = scan_at(read, pos, max(_WINDOW, RECORD.size), size, collect=False)
        if not scan.records:
            break
        total += scan.size
        pos += scan.used
    return pos, total


def _damaged(read: Read, pos: int, nxt: int, jpos: int) -> list[Span]:
    """Spans of file bytes [pos, nxt) between a bad record and the next trustworthy one."""
    recs, p = [], pos
    while p + RECORD.size <= nxt:  # the record lengths, if they lead exactly to `nxt`
        length = RECORD.unpack(read(RECORD.size, p))[0]
        if not length or p + RECORD.size + length > nxt:  # no empty record is ever written
            break
        recs.append((p, length))
        p += RECORD.size + length
    if p != nxt or not recs:
        return [Span(LOST, pos, nxt, jpos, jpos + max(nxt - pos - RECORD.size, 0), True)]
    out = []
    for p, length in recs:
        rec = _record_at(read, p, nxt)
        out.append(Span(GOOD if rec is not None and rec[1] else LOST, p, p + RECORD.size + length, jpos, jpos + length))
        jpos += length
    return out


def plan_damage(read: Read, pos: int, size: int, jpos: int) -> list[Span]:
    """Classify file bytes [pos, size) of an open fragment, where the record at `pos` (journal offset
    `jpos`) is not a valid one: the runs of valid records, the damaged ranges and a torn tail, in order
    (adjacent spans of one kind merged). See the module docstring for the rules."""
    spans: list[Span] = []
    while pos < size:
        end, total = _valid_run(read, pos, size)
        if end > pos:
            spans.append(Span(GOOD, pos, end, jpos, jpos + total))
            pos, jpos = end, jpos + total
            continue
        rec = _record_at(read, pos, size)
        nxt = _resync(read, pos, size, rec)
        if nxt >= 0:
            spans += _damaged(read, pos, nxt, jpos)
            pos, jpos = nxt, spans[-1].jend
        elif rec is not None:  # whole, so appended: damaged, with nothing valid after it
            end = pos + RECORD.size + rec[0]
            spans.append(Span(LOST, pos, end, jpos, jpos + rec[0]))
            pos, jpos = end, jpos + rec[0]
        else:
            spans.append(Span(TORN, pos, size, jpos, jpos))
            break
    merged: list[Span] = []
    for sp in spans:
        last = merged[-1] if merged else None
        if last is not None and last.kind == sp.kind and last.fend == sp.fbegin and last.jend == sp.jbegin:
            merged[-1] = last._replace(fend=sp.fend, jend=sp.jend, estimated=last.estimated or sp.estimated)
        else:
            merged.append(sp)
    return merged
