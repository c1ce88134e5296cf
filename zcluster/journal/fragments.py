"""One file journal's fragments: the mechanics under :class:`zcluster.journal.files.FileJournals`.

A :class:`JournalDir` is one journal directory (laid out as :mod:`zcluster.journal.filefmt` describes)
and its in-process writer state: it brings that state up to date with the directory (recovering torn
tails and the leftovers of an interrupted roll), appends one record to the open fragment, rolls the open
fragment into a fragment file, and reads whole chunks from any offset across fragments and the open
fragment. It knows nothing of other journals, metadata, positions or when to roll: that is the store's
(:mod:`zcluster.journal.files`). Writer methods must be called holding the directory's ``lock`` and its
``flock`` (the store takes both).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from zcluster.journal.filefmt import (
    HEADER,
    LOCK_NAME,
    OPEN_NAME,
    QUARANTINE_DIR,
    RECORD,
    TMP_PREFIX,
    fragment_name,
    pack_header,
    pack_record,
    parse_fragment_name,
    scan_records,
    unpack_header,
)
from zcluster.message.errors import JournalError

__all__ = ["JournalDir", "RecoveryReport", "ScanCursor", "fsync_dir", "write_all"]


class RecoveryReport(NamedTuple):
    """What recovery did to one journal: bytes cut from the open fragment's tail (and the quarantine
    file now holding them, if any), and redundant files removed (temporaries of an interrupted roll,
    an open fragment already rolled into a fragment file)."""

    journal: str
    truncated_bytes: int
    quarantined: Path | None
    removed: tuple[str, ...]


class ScanCursor:
    """Where a scan of an open fragment got to: its inode and begin, a file position and the journal offset there."""

    __slots__ = ("begin", "fpos", "ino", "jpos")

    def __init__(self) -> None:
        self.ino, self.begin, self.fpos, self.jpos = -1, -1, 0, 0


def write_all(fd: int, data: bytes | memoryview, pos: int) -> None:
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


class JournalDir:
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

    def close(self) -> None:
        if self.open_fd is not None:
            os.close(self.open_fd)
            self.open_fd = None
        os.close(self.lock_fd)

    # -- fragments -------------------------------------------------------------------------------------

    def fragments(self) -> list[tuple[int, int]]:
        """The [begin, end) ranges of the complete fragment files, in offset order."""
        out = []
        for n in os.listdir(self.dir):
            r = parse_fragment_name(n)
            if r is not None:
                out.append(r)
        out.sort()
        return out

    def fragments_end(self) -> int:
        frags = self.fragments()
        return frags[-1][1] if frags else 0

    # -- writer (under `lock` and the flock) -----------------------------------------------------------

    def remove_temporaries(self) -> None:
        """Remove the temporaries of an interrupted roll or create (reported)."""
        removed = [n for n in os.listdir(self.dir) if n.startswith(TMP_PREFIX)]
        for n in removed:
            os.unlink(self.dir / n)
        if removed:
            self._report(RecoveryReport(self.name, 0, None, tuple(removed)))

    def drop_open(self) -> None:
        if self.open_fd is not None:
            os.close(self.open_fd)
        self.open_fd, self.open_ino = None, -1

    def sync(self) -> None:
        """Bring the writer state up to date with the directory, recovering torn tails."""
        path = self.dir / OPEN_NAME
        try:
            s = os.stat(path)
        except FileNotFoundError:
            self.drop_open()
            self.end = self.fragments_end()
            return
        if self.open_fd is not None and s.st_ino == self.open_ino and s.st_size == self.open_size:
            return
        if self.open_fd is None or s.st_ino != self.open_ino or s.st_size < self.open_size:
            self.drop_open()
            fd = os.open(path, os.O_RDWR)
            hdr = unpack_header(os.pread(fd, HEADER.size, 0))
            frags_end = self.fragments_end()
            if hdr is None or hdr.begin < frags_end:
                # A header-less file cannot be (opens are created by rename), and an open fragment that
                # starts before the last fragment's end was rolled already (crash before its unlink).
                os.close(fd)
                if hdr is None or any(b == hdr.begin for b, _ in self.fragments()):
                    os.unlink(path)
                    self._report(RecoveryReport(self.name, 0, None, (OPEN_NAME,)))
                    self.end = frags_end
                    return
                raise JournalError(
                    f"journal {self.name!r} in {self.dir}: open fragment begins at {hdr.begin}, "
                    f"inside fragments ending at {frags_end}"
                )
            if hdr.begin > frags_end:
                os.close(fd)
                raise JournalError(
                    f"journal {self.name!r} in {self.dir}: gap between fragments ending at {frags_end} "
                    f"and open fragment at {hdr.begin}"
                )
            self.open_fd, self.open_ino = fd, s.st_ino
            self.open_begin, self.open_created = hdr.begin, hdr.created
            self.open_size, self.end = HEADER.size, hdr.begin
        fd = self.open_fd
        size = os.fstat(fd).st_size
        pos = self.open_size
        while pos < size:
            buf = os.pread(fd, max(self._chunk_size, RECORD.size), pos)
            recs, used = scan_records(buf, pos)
            if not recs and len(buf) >= RECORD.size:
                need = RECORD.size + RECORD.unpack_from(buf)[0]
                if pos + need <= size:
                    buf = os.pread(fd, need, pos)
                    recs, used = scan_records(buf, pos)
            if not recs:
                break
            self.end += sum(r.size for r in recs)
            pos += used
        self.open_size = pos
        if pos < size:
            self._quarantine(pos, size)

    def _quarantine(self, pos: int, size: int) -> None:
        fd = self.open_fd
        assert fd is not None
        torn = os.pread(fd, size - pos, pos)
        qdir = self.dir / QUARANTINE_DIR
        qdir.mkdir(exist_ok=True)
        qpath = qdir / f"{self.open_begin:020d}-at-{pos}-{time.time_ns()}.torn"
        qpath.write_bytes(torn)
        os.ftruncate(fd, pos)
        if self._fsync:
            os.fsync(fd)
        self._report(RecoveryReport(self.name, len(torn), qpath, ()))

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
        """Copy the open fragment's payloads into fragment file ``<begin>-<end>.frag`` and remove it."""
        fd = self.open_fd
        assert fd is not None
        name = fragment_name(self.open_begin, self.end)
        tmp = self.dir / f"{TMP_PREFIX}{name}"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            pos, wpos = HEADER.size, 0
            while pos < self.open_size:
                buf = os.pread(fd, max(self._chunk_size, RECORD.size), pos)
                recs, used = scan_records(buf, pos)
                if not recs:
                    need = RECORD.size + RECORD.unpack_from(buf)[0]
                    buf = os.pread(fd, need, pos)
                    recs, used = scan_records(buf, pos)
                    if not recs:
                        raise JournalError(f"journal {self.name!r}: corrupt record at {OPEN_NAME} position {pos}")
                view = memoryview(buf)
                for r in recs:
                    write_all(out, view[r.pos - pos : r.pos - pos + r.size], wpos)
                    wpos += r.size
                pos += used
            expected = self.end - self.open_begin
            if wpos != expected:
                raise JournalError(f"journal {self.name!r}: rolling {OPEN_NAME} found {wpos} bytes, not {expected}")
            if self._fsync:
                os.fsync(out)
        finally:
            os.close(out)
        os.rename(tmp, self.dir / name)
        os.unlink(self.dir / OPEN_NAME)
        if self._fsync:
            fsync_dir(self.dir)
        self.drop_open()

    # -- reader (no lock: readers see whole records only) -----------------------------------------------

    def readable_end(self) -> int:
        """The end offset of the bytes currently readable (whole appends only)."""
        with self.end_lock:
            cur = self.end_cursor
            try:
                fd = os.open(self.dir / OPEN_NAME, os.O_RDONLY)
            except FileNotFoundError:
                return self.fragments_end()
            try:
                for _ in self._open_records(fd, cur, None):
                    pass
            finally:
                os.close(fd)
            return max(cur.jpos, self.fragments_end())

    def _open_records(self, fd: int, cur: ScanCursor, want: int | None) -> Iterator[tuple[int, memoryview]]:
        """Scan the open fragment `fd` from `cur` (reset if `fd` is another file), advancing `cur`; yield
        (journal offset, payload) of whole records ending past `want` (None: yield nothing, only scan)."""
        # An inode number can be reused once a rolled open fragment is closed: (inode, begin) names one.
        ino = os.fstat(fd).st_ino
        hdr = unpack_header(os.pread(fd, HEADER.size, 0))
        if hdr is None:
            return
        if (cur.ino, cur.begin) != (ino, hdr.begin):
            cur.ino, cur.begin, cur.fpos, cur.jpos = ino, hdr.begin, HEADER.size, hdr.begin
        while True:
            buf = os.pread(fd, max(self._chunk_size, RECORD.size), cur.fpos)
            recs, used = scan_records(buf, cur.fpos)
            if not recs and len(buf) >= RECORD.size:
                buf = os.pread(fd, RECORD.size + RECORD.unpack_from(buf)[0], cur.fpos)
                recs, used = scan_records(buf, cur.fpos)
            if not recs:
                return
            view = memoryview(buf)
            base = cur.fpos
            for r in recs:
                jpos = cur.jpos
                cur.jpos += r.size
                if want is not None and cur.jpos > want:
                    yield jpos, view[r.pos - base : r.pos - base + r.size]
            cur.fpos += used

    def available(self, pos: int, cur: ScanCursor) -> Iterator[tuple[int, bytes]]:
        """Yield every whole chunk readable now from `pos` on, following roll-overs."""
        relisted = False
        while True:
            covering = next(((b, e) for b, e in self.fragments() if b <= pos < e), None)
            if covering is not None:
                b, e = covering
                with open(self.dir / fragment_name(b, e), "rb", buffering=0) as f:
                    f.seek(pos - b)
                    while pos < e:
                        chunk = f.read(min(self._chunk_size, e - pos))
                        if not chunk:
                            raise JournalError(f"journal {self.name!r}: fragment {fragment_name(b, e)} is short")
                        yield pos, chunk
                        pos += len(chunk)
                relisted = False
                continue
            try:
                fd = os.open(self.dir / OPEN_NAME, os.O_RDONLY)
            except FileNotFoundError:
                if relisted:
                    return
                relisted = True  # it may have been rolled between listing and opening: list again
                continue
            try:
                hdr = unpack_header(os.pread(fd, HEADER.size, 0))
                if hdr is None or hdr.begin > pos:
                    if relisted:
                        raise JournalError(f"journal {self.name!r}: no fragment holds offset {pos}")
                    relisted = True
                    continue
                if cur.jpos > pos:
                    cur.ino = -1  # rescan from the header to reach `pos`
                for jpos, payload in self._open_records(fd, cur, pos):
                    start = max(pos - jpos, 0)
                    for i in range(start, len(payload), self._chunk_size):
                        piece = bytes(payload[i : i + self._chunk_size])
                        yield jpos + i, piece
                    pos = jpos + len(payload)
                if os.fstat(fd).st_nlink > 0:
                    return  # still the open fragment: everything whole has been read
                relisted = False  # rolled while we read it: continue in the fragments
            finally:
                os.close(fd)
