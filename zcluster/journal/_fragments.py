"""One file journal's fragments: the mechanics under :class:`zcluster.journal.files.FileJournals`.

Why this module is long: recovery from on-disk damage (sealing an open fragment around damaged records,
quarantining short fragment files, lost-range markers) lives beside the writer and reader it protects.

A :class:`JournalDir` is one journal directory (laid out as :mod:`zcluster.journal._filefmt` describes)
and its in-process writer state: it brings that state up to date with the directory (recovering torn
tails, damaged records and the leftovers of an interrupted roll), appends one record to the open fragment,
rolls the open fragment into a fragment file, and reads whole chunks from any offset across fragments and
the open fragment, stopping with an OffsetOutOfRangeError at a lost range.

Damage, and what becomes of it (offsets once handed out are never reused for other bytes):

* A fragment file shorter than its name says, or whose bytes fail the checksum in its name
  (:meth:`JournalDir.check_fragments`, run by recovery; the checksum also by every reader, before it
  returns any byte of the fragment, once per process and file version): moved whole to ``_quarantine/``;
  a lost-range marker takes its place.
* A fragment file missing (removed): the bytes no file holds, between the sealed pieces or between them
  and the open fragment's begin, are a lost range (:meth:`JournalDir.gaps`) as soon as they are missing;
  recovery writes its marker. What cannot be seen: the *last* sealed fragment removed while no open
  fragment follows it (nothing on disk remembers the end then; a consumer checkpoint past the new end
  shows it), and an open fragment removed with no writer of this process alive.
* An open fragment holding damaged records (found when a writer scans it, or when it rolls): *sealed*
  at once: each run of valid records becomes a fragment file, each damaged range a lost-range marker (its
  bytes copied to ``_quarantine/``), and the open fragment is removed; appends go on in a new one. The
  same when bytes a writer of this process already saw were cut off the open fragment (truncation).
* A torn append at its end (an incomplete record: the append never returned) is cut off and quarantined;
  its offsets are used again.
* An open fragment whose header is damaged is sealed if its begin offset still reads as the end of the
  sealed pieces, else moved whole to ``_quarantine/`` (its offsets can then not be told, and are reused,
  but for those this process saw handed out).

It knows nothing of other journals, metadata, positions or when to roll: that is the store's
(:mod:`zcluster.journal.files`). Writer methods must be called holding the directory's ``lock`` and its
``flock`` (the store takes both).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from zcluster.journal import _marks
from zcluster.journal._filefmt import (
    GOOD,
    HEADER,
    LOCK_NAME,
    LOST,
    OPEN_NAME,
    QUARANTINE_DIR,
    RECORD,
    TMP_PREFIX,
    TORN,
    Span,
    fragment_name,
    lost_name,
    pack_header,
    pack_record,
    plan_damage,
    scan_at,
    unpack_header,
)
from zcluster.journal._pieces import MISSING, LostRange, Piece, SealedPieces
from zcluster.message.errors import JournalError

_EVERYWHERE = 1 << 62  # a journal offset past every record boundary

__all__ = ["JournalDir", "LostRange", "Piece", "RecoveryReport", "ScanCursor", "fsync_dir", "write_all"]


class RecoveryReport(NamedTuple):
    """What recovery did to one journal: bytes cut from the open fragment (and the quarantine file now
    holding them, if any), redundant files removed (temporaries of an interrupted roll; an open fragment
    already rolled into a fragment file, moved to the quarantine), and `lost`: journal byte ranges that
    were appended but can no longer be read (damaged records, a fragment file found short). A lost
    range's offsets are never handed out again; readers reaching it get an OffsetOutOfRangeError naming it."""

    journal: str
    truncated_bytes: int
    quarantined: Path | None
    removed: tuple[str, ...]
    lost: tuple[tuple[int, int], ...] = ()


class ScanCursor:
    """Where a scan of an open fragment got to: its inode and begin, a file position and the journal offset there."""

    __slots__ = ("begin", "fpos", "ino", "jpos")

    def __init__(self) -> None:
        self.ino, self.begin, self.fpos, self.jpos = -1, -1, 0, 0


def write_all(fd: int, data: bytes | bytearray | memoryview, pos: int) -> None:
    """Write all of `data` at file position `pos`."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, pos)
        view, pos = view[n:], pos + n


def fsync_dir(path: Path) -> None:
    """fsync a directory (so a rename or an unlink in it is durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JournalDir(SealedPieces):
    """One journal directory and its in-process state. Writer fields are valid only while holding `lock`
    and the flock of `lock_fd`; `report` receives every non-trivial recovery."""

    def __init__(
        self, name: str, directory: Path, *, chunk_size: int, fsync: bool, report: Callable[[RecoveryReport], None]
    ) -> None:
        self.name = name
        self.dir = directory
        self._chunk_size = chunk_size
        self._fsync = fsync
        self._report = report
        self.lock = threading.Lock()
        self.lock_fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        self.open_fd: int | None = None
        self.open_ino = -1
        self.open_begin = 0
        self.open_created = 0.0
        self.open_size = 0  # file bytes of valid records (header included)
        self.end = 0  # journal end offset
        self.end_lock = threading.Lock()
        self.end_cursor = ScanCursor()
        self.dir_key = os.path.abspath(directory)  # names its open fragments' boundaries in _marks
        # Where this object's last scan of the open fragment ended: trusted by this object only, as _marks
        # trusts only boundaries a whole record follows (the last record may be an append being taken back).
        self._scanned: tuple[tuple[int, int, float], int, int] | None = None
        # Fragment files whose checksum held: name -> (inode, size, mtime) of the version checked.
        self._verified: dict[str, tuple[int, int, int]] = {}

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the writer locks: `lock` (this process's threads) and the flock (other processes)."""
        with self.lock:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self.lock_fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self.open_fd is not None:
            os.close(self.open_fd)
            self.open_fd = None
        os.close(self.lock_fd)

    # -- fragments and lost ranges -------------------------------------------------------------------

    # -- writer (under `lock` and the flock) -----------------------------------------------------------

    def remove_temporaries(self) -> None:
        """Remove the temporaries of an interrupted roll or create (reported)."""
        removed = [n for n in os.listdir(self.dir) if n.startswith(TMP_PREFIX)]
        for n in removed:
            os.unlink(self.dir / n)
        if removed:
            self._report(RecoveryReport(self.name, 0, None, tuple(removed)))

    def check_fragments(self) -> None:
        """Move every fragment file shorter than its name says, or failing its checksum, to ``_quarantine/``,
        leaving a lost range in its place (reported). The marker is written first: a crash in between
        leaves both, and this redoes it."""
        for p in self.pieces():
            if p.lost:
                continue
            path = self.dir / p.name
            try:
                size = os.stat(path).st_size
                if size < p.end - p.begin:
                    why, what = f"fragment file {p.name} held {size} of {p.end - p.begin} bytes", "short"
                elif not self.intact(p):
                    why, what = f"fragment file {p.name}: its bytes fail the checksum in its name", "damaged"
                else:
                    continue
            except FileNotFoundError:
                continue
            qpath = self._quarantine_dir() / f"{p.name}-{time.time_ns()}.{what}"
            tmp, final = self._write_marker(p.begin, p.end, qpath, why)
            os.rename(tmp, final)
            os.rename(path, qpath)
            if self._fsync:
                fsync_dir(self.dir)
            self._report(RecoveryReport(self.name, 0, qpath, (), ((p.begin, p.end),)))

    def mark_gaps(self) -> None:
        """Write the marker of every gap (:meth:`gaps`: fragment files missing), reported. Run after
        :meth:`sync`, which finishes an interrupted seal (whose pieces are not a gap)."""
        for b, e in self.gaps():
            tmp, final = self._write_marker(b, e, None, MISSING)
            os.rename(tmp, final)
            if self._fsync:
                fsync_dir(self.dir)
            self._report(RecoveryReport(self.name, 0, None, (), ((b, e),)))

    def check_now(self) -> None:
        """:meth:`check_fragments` under the writer locks (a reader that found a fragment failing its checksum)."""
        with self.locked():
            self.check_fragments()

    def drop_open(self) -> None:
        if self.open_fd is not None:
            os.close(self.open_fd)
        self.open_fd, self.open_ino = None, -1

    def sync(self) -> None:
        """Bring the writer state up to date with the directory, recovering torn tails and damaged records."""
        path = self.dir / OPEN_NAME
        known = self.end if self.open_fd is not None else -1  # offsets this process saw handed out
        try:
            s = os.stat(path)
        except FileNotFoundError:
            self.drop_open()
            self.end = self.pieces_end()
            if known > self.end:  # the open fragment vanished under a live writer
                self._mark_lost(self.end, known, None, f"{OPEN_NAME} removed under a live writer")
            return
        if self.open_fd is not None and s.st_ino == self.open_ino and s.st_size == self.open_size:
            return
        seal = False
        if self.open_fd is None or s.st_ino != self.open_ino or s.st_size < self.open_size:
            self.drop_open()
            fd = os.open(path, os.O_RDWR)
            head = os.pread(fd, HEADER.size, 0)
            strict = unpack_header(head)
            hdr = strict or unpack_header(head, lenient=True)
            pieces = self.pieces()
            sealed_end = max((p.end for p in pieces), default=0)
            if strict is not None and any(p.begin == strict.begin for p in pieces):
                # Rolled or sealed already: the process died before removing it. Set aside, not deleted:
                # a damaged begin offset could look like this too.
                os.close(fd)
                self._set_aside(path, 0, "rolled")
                self.end = sealed_end
                return
            if hdr is None or (strict is None and hdr.begin != sealed_end):
                # A damaged header (opens are created whole, by rename) that does not tell where it begins.
                os.close(fd)
                qpath = self._set_aside(path, s.st_size, "damaged")
                self.end = sealed_end
                if known > sealed_end:
                    self._mark_lost(sealed_end, known, qpath, f"{OPEN_NAME} with a damaged header")
                return
            if strict is None:
                seal = True  # a damaged header whose begin offset still fits: its records are sealed
            elif hdr.begin < sealed_end:
                if any(p.begin < hdr.begin < p.end for p in pieces):
                    os.close(fd)
                    raise JournalError(
                        f"journal {self.name!r} in {self.dir}: open fragment begins at {hdr.begin}, "
                        f"inside fragments ending at {sealed_end}"
                    )
                seal, known = True, max(known, sealed_end)  # a seal that was interrupted: done again
            elif hdr.begin > sealed_end:  # the fragment files before it were removed
                self._mark_lost(sealed_end, hdr.begin, None, MISSING)
            self.open_fd, self.open_ino = fd, s.st_ino
            self.open_begin, self.open_created = hdr.begin, hdr.created
            self.open_size, self.end = HEADER.size, hdr.begin
            if strict is None:
                qpath = self._quarantine_copy(0, HEADER.size, "header")
                self._report(RecoveryReport(self.name, HEADER.size, qpath, ()))
        fd = self.open_fd
        assert fd is not None
        size = os.fstat(fd).st_size
        pos = self.open_size
        key = (self.open_ino, self.open_begin, self.open_created)
        while pos < size:
            scan = scan_at(self._read, pos, max(self._chunk_size, RECORD.size), size, collect=False)
            if not scan.records:
                break
            self.end += scan.size
            pos += scan.used
            _marks.note(self.dir_key, key, self.end, pos)  # for readers of this process (see _open_chunks)
        self.open_size = pos
        if pos == size and not seal and known <= self.end:
            self._share_scan()
            return
        spans = plan_damage(self._read, pos, size, self.end) if pos < size else []
        if not seal and known <= self.end and all(sp.kind == TORN for sp in spans):
            self._quarantine(pos, size)  # a torn append: cut off, and its offsets used again
            self._share_scan()
        else:
            self._seal([Span(GOOD, HEADER.size, pos, self.open_begin, self.end), *spans], known)

    def _share_scan(self) -> None:
        """Let readers of this process start where this writer's scan of the open fragment got to: its
        records up to ``open_size`` are whole and valid (readable_end then scans only what follows)."""
        _marks.note(self.dir_key, (self.open_ino, self.open_begin, self.open_created), self.end, self.open_size)
        with self.end_lock:
            cur = self.end_cursor
            if (cur.ino, cur.begin) != (self.open_ino, self.open_begin) or cur.jpos < self.end:
                cur.ino, cur.begin, cur.fpos, cur.jpos = self.open_ino, self.open_begin, self.open_size, self.end

    def _read(self, n: int, pos: int) -> bytes:
        assert self.open_fd is not None
        return os.pread(self.open_fd, n, pos)

    def _quarantine_dir(self) -> Path:
        qdir = self.dir / QUARANTINE_DIR
        qdir.mkdir(exist_ok=True)
        return qdir

    def _quarantine(self, pos: int, size: int) -> None:
        """Move a torn tail, file bytes [pos, size) of the open fragment, to ``_quarantine/`` (reported)."""
        assert self.open_fd is not None
        qpath = self._quarantine_copy(pos, size, "torn")
        os.ftruncate(self.open_fd, pos)
        if self._fsync:
            os.fsync(self.open_fd)
        self._report(RecoveryReport(self.name, size - pos, qpath, ()))

    def _quarantine_copy(self, fbegin: int, fend: int, what: str) -> Path:
        """Copy bytes [fbegin, fend) of the open fragment to a new file of ``_quarantine/``."""
        qpath = self._quarantine_dir() / f"{self.open_begin:020d}-at-{fbegin}-{time.time_ns()}.{what}"
        out = os.open(qpath, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            pos = fbegin
            while pos < fend:
                data = self._read(min(fend - pos, max(self._chunk_size, 1 << 16)), pos)
                if not data:
                    break
                write_all(out, data, pos - fbegin)
                pos += len(data)
            if self._fsync:
                os.fsync(out)
        finally:
            os.close(out)
        return qpath

    def _write_marker(self, begin: int, end: int, qpath: Path | None, reason: str) -> tuple[Path, Path]:
        """Write the marker of lost range [begin, end) under a temporary name; return it and its final name."""
        name = lost_name(begin, end)
        doc = {
            "begin": begin,
            "end": end,
            "quarantined": None if qpath is None else qpath.relative_to(self.dir).as_posix(),
            "reason": reason,
            "time": time.time(),
        }
        tmp = self.dir / f"{TMP_PREFIX}{name}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, json.dumps(doc, sort_keys=True).encode(), 0)
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return tmp, self.dir / name

    def _mark_lost(self, begin: int, end: int, qpath: Path | None, reason: str) -> None:
        tmp, final = self._write_marker(begin, end, qpath, reason)
        os.rename(tmp, final)
        if self._fsync:
            fsync_dir(self.dir)
        self.end = max(self.end, end)
        self._report(RecoveryReport(self.name, 0, qpath, (), ((begin, end),)))

    def _set_aside(self, path: Path, cut: int, what: str) -> Path:
        """Move a whole open fragment that has no place in the journal to ``_quarantine/`` (reported, with
        `cut` bytes cut off the journal)."""
        qpath = self._quarantine_dir() / f"open-{time.time_ns()}.{what}"
        os.rename(path, qpath)
        if self._fsync:
            fsync_dir(self.dir)
        self._report(RecoveryReport(self.name, cut, qpath, (OPEN_NAME,)))
        return qpath

    def append_record(self, payload: bytes) -> None:
        """Append `payload` as one record to the open fragment (created if there is none); on failure,
        cut the open fragment back so no part of the record remains."""
        if self.open_fd is None:
            self._create_open()
        fd = self.open_fd
        assert fd is not None
        rec = pack_record(payload)
        try:
            write_all(fd, rec, self.open_size)
            if self._fsync:
                os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, self.open_size)
            raise
        self.open_size += len(rec)
        self.end += len(payload)

    def _create_open(self) -> None:
        now = time.time()
        tmp = self.dir / f"{TMP_PREFIX}open-{os.getpid()}"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, pack_header(self.end, now), 0)
            if self._fsync:
                os.fsync(fd)
            os.rename(tmp, self.dir / OPEN_NAME)
        except BaseException:
            os.close(fd)
            raise
        self.open_fd, self.open_ino = fd, os.fstat(fd).st_ino
        self.open_begin, self.open_created, self.open_size = self.end, now, HEADER.size

    def roll(self) -> None:
        """Copy the open fragment's payloads into fragment file ``<begin>-<end>.frag`` and remove it (a
        record found damaged on the way: sealed around, as :meth:`sync` does)."""
        self._seal([Span(GOOD, HEADER.size, self.open_size, self.open_begin, self.end)], self.end)

    def _seal(self, spans: list[Span], known: int) -> None:
        """Replace the open fragment by sealed pieces: a fragment file per run of valid records, a lost-range
        marker per damaged range (its bytes copied to ``_quarantine/``), torn bytes to ``_quarantine/``; a lost
        range up to `known` if fewer bytes remain than this process saw. Pieces are renamed into place last
        first, so until the one at the open fragment's begin is, the next sync seals it again."""
        renames: list[tuple[Path, Path]] = []
        reports: list[RecoveryReport] = []
        cut_off = f"bytes cut off {OPEN_NAME} under a live writer"
        cut = None
        if spans and spans[-1].kind == TORN and known > spans[-1].jend:  # not a torn append: a cut-off one
            spans[-1] = cut = spans[-1]._replace(kind=LOST, jend=known)
        i = 0
        while i < len(spans):
            sp = spans[i]
            i += 1
            if sp.kind == GOOD:
                if sp.jend == sp.jbegin:
                    continue
                tmp, fpos, jpos, crc = self._write_fragment(sp)
                if fpos < sp.fend:  # a record rotted since it was read: seal around it too
                    os.unlink(tmp)
                    head = [Span(GOOD, sp.fbegin, fpos, sp.jbegin, jpos)] if fpos > sp.fbegin else []
                    spans[i - 1 : i] = head + plan_damage(self._read, fpos, sp.fend, jpos)
                    i -= 1
                    continue
                if jpos != sp.jend:
                    os.unlink(tmp)
                    raise JournalError(f"journal {self.name!r}: sealing {OPEN_NAME} found {jpos} bytes, not {sp.jend}")
                renames.append((tmp, self.dir / fragment_name(sp.jbegin, sp.jend, crc)))
                continue
            qpath = self._quarantine_copy(sp.fbegin, sp.fend, "damaged" if sp.kind == LOST else "torn")
            if sp.kind == LOST and sp.jend > sp.jbegin:
                reason = cut_off if sp is cut else f"damaged records of {OPEN_NAME} at {sp.fbegin}..{sp.fend}"
                if sp.estimated:
                    reason += "; record headers unreadable: its size is an upper bound, later offsets may be shifted"
                renames.append(self._write_marker(sp.jbegin, sp.jend, qpath, reason))
                reports.append(RecoveryReport(self.name, 0, qpath, (), ((sp.jbegin, sp.jend),)))
            else:
                reports.append(RecoveryReport(self.name, sp.fend - sp.fbegin, qpath, ()))
        end = spans[-1].jend if spans else self.open_begin
        if known > end:
            renames.append(self._write_marker(end, known, None, cut_off))
            reports.append(RecoveryReport(self.name, 0, None, (), ((end, known),)))
            end = known
        for tmp, final in reversed(renames):
            os.rename(tmp, final)
        os.unlink(self.dir / OPEN_NAME)
        if self._fsync:
            fsync_dir(self.dir)
        self.drop_open()
        self.end = end
        for report in reports:
            self._report(report)

    def _write_fragment(self, sp: Span) -> tuple[Path, int, int, int]:
        """Copy the payloads of the valid records of span `sp` into a temporary file; return it, the file
        position and journal offset reached (short of the span's end if a record there is not valid) and
        the CRC-32 of the bytes written."""
        tmp = self.dir / f"{TMP_PREFIX}{fragment_name(sp.jbegin, sp.jend)}"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        pos, wpos, crc = sp.fbegin, 0, 0
        try:
            while pos < sp.fend:
                n = min(max(self._chunk_size, RECORD.size), sp.fend - pos)
                scan = scan_at(self._read, pos, n, sp.fend)
                if not scan.records or scan.payload is None:
                    break
                write_all(out, scan.payload, wpos)  # one write per read, not one per record
                crc = zlib.crc32(scan.payload, crc)
                wpos += len(scan.payload)
                pos += scan.used
            if self._fsync:
                os.fsync(out)
        finally:
            os.close(out)
        return tmp, pos, sp.jbegin + wpos, crc

    # -- reader (no lock: readers see whole records only) -----------------------------------------------

    def readable_end(self) -> int:
        """The end offset of the bytes currently readable (whole appends only)."""
        with self.end_lock:
            cur = self.end_cursor
            try:
                fd = os.open(self.dir / OPEN_NAME, os.O_RDONLY)
            except FileNotFoundError:
                return self.pieces_end()
            try:
                for _ in self._open_chunks(fd, cur, None):
                    pass
            finally:
                os.close(fd)
            return max(cur.jpos, self.pieces_end())

    def readable(self, pos: int) -> bool:
        """Whether offset `pos` is at most the end of the readable bytes (the open fragment is scanned only
        when `pos` lies past the sealed pieces)."""
        return pos >= 0 and (pos <= self.pieces_end() or pos <= self.readable_end())

    def _open_chunks(self, fd: int, cur: ScanCursor, want: int | None) -> Iterator[tuple[int, bytes]]:
        """Scan the open fragment `fd` from `cur` (reset if `fd` is another file, or if `cur` is past
        `want`), advancing `cur`; yield (journal offset, bytes) of the whole records' payloads from `want`
        on, a read buffer's worth at a time (None: yield nothing, only scan).

        Records are read and checked a buffer at a time (:func:`scan_at`): buffers of the marks' spacing
        (64 KiB) while only checking, doubling up to the read chunk once payloads may reach `want`. Where a
        buffer's whole records start is remembered for the whole process (:mod:`zcluster.journal._marks`:
        only boundaries a whole record follows, which no failed append can take back), so that a scan
        towards `want` starts at most about 64 KiB before it rather than at the header, also in a store
        opened since (a Spark task's). Where this object's last scan ended is kept too, for this object
        only: its scan for the end (`want` None) after a read costs a stat."""
        # An inode number can be reused once a rolled open fragment is closed: (inode, begin) names one.
        st = os.fstat(fd)
        hdr = unpack_header(os.pread(fd, HEADER.size, 0))
        if hdr is None:
            return
        key = (st.st_ino, hdr.begin, hdr.created)
        # A cursor past the file's size: the fragment was cut short since (damage); what it passed is not
        # there now. Kept, it would hold on to the old end (a store's end() and every lag computed from it).
        if (
            (cur.ino, cur.begin) != (st.st_ino, hdr.begin)
            or (want is not None and cur.jpos > want)
            or cur.fpos > st.st_size
        ):
            cur.ino, cur.begin, cur.fpos, cur.jpos = st.st_ino, hdr.begin, HEADER.size, hdr.begin
        if want is None or cur.jpos < want:
            # Towards `want`, or to the end (None: a scan for the end starts from the last boundary seen,
            # e.g. by the read that just went there, rather than from the header)
            upto = _EVERYWHERE if want is None else want
            mark = _marks.before(self.dir_key, key, upto, st.st_size)
            last = self._scanned  # where this object's last scan ended (a tuple: read without a lock)
            if last is not None and last[0] == key and last[1] <= upto and last[2] <= st.st_size:
                mark = last[1:] if mark is None else max(mark, last[1:])
            if mark is not None and mark[0] > cur.jpos:
                cur.jpos, cur.fpos = mark
        read = functools.partial(os.pread, fd)
        window = max(self._chunk_size, RECORD.size)
        # The buffer: the marks' spacing while only checking records, then doubling up to the read chunk
        # from `want` on (a short read, the common case of a streaming batch, stops after one or two).
        step = max(min(window, _marks.SPACING), RECORD.size)
        size, remeasured = st.st_size, False
        while True:
            # Payloads are collected only from the buffers that may reach `want` (a buffer's payloads are
            # shorter than it). A record larger than the buffer is read whole if the file holds it (a
            # damaged length can claim up to 4 GiB: never allocated); the file may have grown meanwhile.
            collect = want is not None and cur.jpos + step > want
            scan = scan_at(read, cur.fpos, step, size, collect=collect)
            if collect:
                step = min(2 * step, window)
            if not scan.records:
                if remeasured or (grown := os.fstat(fd).st_size) == size:
                    return
                size, remeasured = grown, True
                continue
            remeasured = False
            if cur.fpos > HEADER.size:  # a boundary followed by a whole record: there for good (see _marks)
                _marks.note(self.dir_key, key, cur.jpos, cur.fpos)
            reaches = want is not None and cur.jpos + scan.size > want
            if reaches and scan.payload is None:  # a record larger than the window: read it again, whole
                scan = scan_at(read, cur.fpos, window, size)
            jpos = cur.jpos
            cur.fpos += scan.used
            cur.jpos += scan.size
            self._scanned = (key, cur.jpos, cur.fpos)
            if not reaches or want is None or scan.payload is None:
                continue
            if jpos < want:  # `want` lies in this buffer
                yield want, bytes(memoryview(scan.payload)[want - jpos :])
            else:
                yield jpos, bytes(scan.payload)

    def available(self, pos: int, cur: ScanCursor) -> Iterator[tuple[int, bytes]]:
        """Yield every whole chunk readable now from `pos` on, following roll-overs."""
        relisted = False
        while True:
            covering = next((p for p in self.pieces() if p.begin <= pos < p.end), None)
            if covering is not None:
                b, e = covering.begin, covering.end
                if covering.lost:
                    raise self._lost_error(self._lost_range(b, e))
                if not self.intact(covering):  # no byte of it is returned: it becomes a lost range
                    self.check_now()
                    raise self.lost_error(pos) or JournalError(
                        f"journal {self.name!r}: fragment {covering.name} fails its checksum"
                    )
                with open(self.dir / covering.name, "rb", buffering=0) as f:
                    f.seek(pos - b)
                    while pos < e:
                        chunk = f.read(min(self._chunk_size, e - pos))
                        if not chunk:
                            raise JournalError(
                                f"journal {self.name!r}: fragment {covering.name} holds fewer bytes than "
                                "its name says (damaged); FileJournals.recover() moves it aside"
                            )
                        yield pos, chunk
                        pos += len(chunk)
                relisted = False
                continue
            try:
                fd = os.open(self.dir / OPEN_NAME, os.O_RDONLY)
            except FileNotFoundError:
                if relisted:
                    if (lost := self.lost_error(pos)) is not None:  # fragment files missing: a gap
                        raise lost from None
                    return
                relisted = True  # it may have been rolled between listing and opening: list again
                continue
            try:
                hdr = unpack_header(os.pread(fd, HEADER.size, 0))
                if hdr is None or hdr.begin > pos:
                    if relisted:
                        raise self.lost_error(pos, gaps=True) or JournalError(
                            f"journal {self.name!r}: no fragment holds offset {pos}"
                        )
                    relisted = True
                    continue
                chunk = self._chunk_size
                for jpos, data in self._open_chunks(fd, cur, pos):
                    if len(data) <= chunk:
                        yield jpos, data
                    else:  # a record larger than the read chunk
                        view = memoryview(data)
                        for i in range(0, len(data), chunk):
                            yield jpos + i, bytes(view[i : i + chunk])
                    pos = jpos + len(data)
                if os.fstat(fd).st_nlink > 0:
                    return  # still the open fragment: everything whole has been read
                relisted = False  # rolled while we read it: continue in the fragments
            finally:
                os.close(fd)
