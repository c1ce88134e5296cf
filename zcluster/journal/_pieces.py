"""The sealed pieces of one file journal: fragment files, lost-range markers and gaps, read from its directory.

:class:`SealedPieces` is the read-only view :class:`zcluster.journal._fragments.JournalDir` builds on: what
the directory listing says (fragment files with their checksums, lost-range markers), the gaps no file holds
(fragment files removed), the lost ranges readers stop at, and the check of a fragment file's checksum.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import NamedTuple

from zcluster.journal._filefmt import HEADER, OPEN_NAME, lost_name, parse_fragment_name, parse_lost_name, unpack_header
from zcluster.message.errors import OffsetOutOfRangeError

__all__ = ["MISSING", "LostRange", "Piece", "SealedPieces"]

MISSING = "no fragment file holds these bytes: a fragment file was removed"


class LostRange(NamedTuple):
    """A lost range of a journal: bytes [begin, end) that were appended but can no longer be read; why
    (``reason``), where what survives of them was moved (``quarantined``, relative to the journal's
    directory) and when it was found (``found_at``, a Unix time; None if unknown)."""

    begin: int
    end: int
    reason: str
    quarantined: str | None = None
    found_at: float | None = None


class Piece(NamedTuple):
    """A sealed piece of a journal: a fragment file (`crc`: the CRC-32 its name gives, None for one written
    before checksums) or a lost-range marker (`lost`); `name`: its file."""

    begin: int
    end: int
    lost: bool
    name: str
    crc: int | None = None


class SealedPieces:
    """The sealed pieces of the journal `name` in directory `dir` (see the module docstring)."""

    name: str
    dir: Path
    _chunk_size: int
    _verified: dict[str, tuple[int, int, int]]  # fragment files whose checksum held: name -> (inode, size, mtime)

    def pieces(self) -> list[Piece]:
        """The fragment files and the lost-range markers, in offset order."""
        out = []
        for n in os.listdir(self.dir):
            r = parse_fragment_name(n)
            if r is not None:
                out.append(Piece(r[0], r[1], False, n, r[2]))
            elif (m := parse_lost_name(n)) is not None:
                out.append(Piece(m[0], m[1], True, n))
        out.sort()
        return out

    def pieces_end(self) -> int:
        """The end of the sealed part of the journal (fragment files and lost ranges)."""
        return max((p.end for p in self.pieces()), default=0)

    def _open_head(self) -> tuple[int, float] | None:
        """(begin, creation time) of the open fragment now, or None if there is none (or its header is damaged)."""
        try:
            fd = os.open(self.dir / OPEN_NAME, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            hdr = unpack_header(os.pread(fd, HEADER.size, 0))
        finally:
            os.close(fd)
        return None if hdr is None else (hdr.begin, hdr.created)

    def gaps(self) -> list[tuple[int, int]]:
        """The journal byte ranges [begin, end) that no file holds: missing fragment files, between the
        sealed pieces (from offset 0) or between them and the open fragment. Bytes from the open fragment's
        begin on are never a gap: a seal in progress renames its pieces into place last first, while the
        open fragment still holds them (the listing is taken between two reads of the open fragment's
        header that agree, so it sees no seal half done)."""
        head = self._open_head()
        while True:
            pieces = self.pieces()
            now = self._open_head()
            if now == head:
                break
            head = now
        limit = None if head is None else head[0]
        out, pos = [], 0
        for p in pieces:
            if p.begin > pos and (limit is None or pos < limit):
                out.append((pos, p.begin if limit is None else min(p.begin, limit)))
            pos = max(pos, p.end)
        if limit is not None and limit > pos:
            out.append((pos, limit))
        return out

    def lost_ranges(self) -> list[LostRange]:
        """The journal's lost ranges, in offset order, with what their markers recorded; a gap (a fragment
        file missing, :meth:`gaps`) that recovery has not recorded yet is one too."""
        out = [self._lost_range(p.begin, p.end) for p in self.pieces() if p.lost]
        out += [LostRange(b, e, MISSING) for b, e in self.gaps()]
        return sorted(out, key=lambda r: r.begin)

    def _lost_range(self, b: int, e: int) -> LostRange:
        try:
            doc = json.loads((self.dir / lost_name(b, e)).read_text())
        except FileNotFoundError:
            return LostRange(b, e, MISSING)  # a gap
        except (OSError, ValueError):
            doc = {}
        at = doc.get("time")
        return LostRange(b, e, str(doc.get("reason", "damaged")), doc.get("quarantined"), at)

    def lost_error(self, pos: int, *, gaps: bool = False) -> OffsetOutOfRangeError | None:
        """The error a reader gets at `pos` if a lost range holds it, else None (its attributes name the
        range and the offset to read on from). A gap (:meth:`gaps`) is looked for when no piece holds `pos`
        and it lies before the end of the sealed pieces, or always with `gaps` (the readers that found the
        open fragment beginning past `pos`)."""
        pieces = self.pieces()
        hit = next((p for p in pieces if p.begin <= pos < p.end), None)
        if hit is not None:
            return self._lost_error(self._lost_range(hit.begin, hit.end)) if hit.lost else None
        if gaps or pos < max((p.end for p in pieces), default=0):
            gap = next(((b, e) for b, e in self.gaps() if b <= pos < e), None)
            if gap is not None:
                return self._lost_error(self._lost_range(*gap))
        return None

    def _lost_error(self, r: LostRange) -> OffsetOutOfRangeError:
        b, e = r.begin, r.end
        where = f"; what survives of them is in {r.quarantined}" if r.quarantined else ""
        return OffsetOutOfRangeError(
            f"journal {self.name!r}: bytes {b}..{e} were lost ({r.reason}{where}); reading can go on at offset {e}",
            journal=self.name,
            lost_begin=b,
            lost_end=e,
            resume_offset=e,
            reason=r.reason,
        )

    def intact(self, p: Piece) -> bool:
        """Whether fragment file `p` holds the bytes its checksum names (True when its name has none: it
        was written before checksums, nothing can be checked). Each version of a file (inode, size,
        modification time) is read once per process; a file found short is not intact."""
        if p.crc is None:
            return True
        path = self.dir / p.name
        st = os.stat(path)
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._verified.get(p.name) == key:
            return True
        crc, left = 0, p.end - p.begin
        with open(path, "rb", buffering=0) as f:
            while left > 0 and (data := f.read(min(left, max(self._chunk_size, 1 << 16)))):
                crc = zlib.crc32(data, crc)
                left -= len(data)
        if left or crc != p.crc:
            return False
        if len(self._verified) >= 1 << 14:  # fragments removed since: forget them all, rarely
            self._verified.clear()
        self._verified[p.name] = key
        return True
