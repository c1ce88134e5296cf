"""File-fragment journals: the embedded backend, no server needed.

Each journal is a directory under a root (``root/<journal name>/``) laid out as :mod:`filefmt` describes:
complete fragments ``<begin>-<end>.frag`` plus one hidden open fragment ``.open`` taking appends.

Guarantees:

* Appends are atomic per call (one CRC-checked record; a reader never sees part of it) and serialised
  across threads (a lock per journal) and processes (``fcntl.flock`` on ``_lock``), in offset order.
* A fragment file appears under its final name only when complete (written to a hidden temporary name,
  then renamed), so a Spark file-source query over the directory only ever sees whole fragments, and each
  fragment holds whole appends (hence whole frames, when every append holds whole frames).
* The open fragment rolls over into a fragment file when it reaches ``fragment_bytes`` (checked after
  each append) or is older than ``fragment_age`` seconds (checked before each append and by
  :meth:`FileJournals.roll_aged`, which writers of idle journals call periodically).
* A writer killed mid-append leaves a torn record that no reader returns. The next appender (any process)
  or :meth:`FileJournals.recover` cuts it off: the torn bytes are moved to ``_quarantine/`` and the open
  fragment is truncated, a warning is logged and a :class:`RecoveryReport` is added to
  ``FileJournals.recovered``. Opening a root recovers every journal in it.
* Readers read from any offset up to the end, block (in-process appends wake them at once; other
  processes' appends are seen within ``poll_interval``) or stop at the end, and keep reading across
  roll-overs. Durability: with ``fsync=True`` every append, roll and position is fsynced before it
  returns; without it, data survives process crashes but not necessarily power loss.

Not guaranteed: destroying a journal while readers or writers use it (they fail with JournalError or
OSError); fragments written by other tools into the directory.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from zcluster.journal.filefmt import (
    HEADER,
    LOCK_NAME,
    META_NAME,
    OPEN_NAME,
    POSITIONS_DIR,
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
from zcluster.journal.store import (
    JournalExistsError,
    JournalInfo,
    append_results,
    validate_group,
    validate_journal_name,
    validate_labels,
)
from zcluster.message.journals import (
    AppendResult,
    JournalError,
    JournalNotFoundError,
    JournalSpec,
    OffsetOutOfRangeError,
)
from zcluster.message.labels import LabelSelector, parse_selector

__all__ = ["FileJournals", "RecoveryReport"]

log = logging.getLogger(__name__)


class RecoveryReport(NamedTuple):
    """What recovery did to one journal: bytes cut from the open fragment's tail (and the quarantine
    file now holding them, if any), and redundant files removed (temporaries of an interrupted roll,
    an open fragment already rolled into a fragment file)."""

    journal: str
    truncated_bytes: int
    quarantined: Path | None
    removed: tuple[str, ...]


class _Cursor:
    """Where a scan of an open fragment got to: its inode and begin, a file position and the journal offset there."""

    __slots__ = ("begin", "fpos", "ino", "jpos")

    def __init__(self) -> None:
        self.ino, self.begin, self.fpos, self.jpos = -1, -1, 0, 0


class _State:
    """In-process state of one journal. Writer fields are valid only while holding `lock` and the flock."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name = name
        self.dir = directory
        self.lock = threading.Lock()
        self.lock_fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        self.open_fd: int | None = None
        self.open_ino = -1
        self.open_begin = 0
        self.open_created = 0.0
        self.open_size = 0  # file bytes of valid records (header included)
        self.end = 0  # journal end offset
        self.end_lock = threading.Lock()
        self.end_cursor = _Cursor()

    def close(self) -> None:
        if self.open_fd is not None:
            os.close(self.open_fd)
            self.open_fd = None
        os.close(self.lock_fd)


def _write_all(fd: int, data: bytes | memoryview, pos: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, pos)
        view, pos = view[n:], pos + n


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileJournals:
    """Journals stored as fragment files under `root` (created if missing); see the module docstring.

    Implements the message layer's JournalWriter/JournalReader/JournalLister and
    :class:`zcluster.journal.store.JournalStore`. Safe for concurrent use by threads; any number of
    processes may open the same root. Call :meth:`close` (or use ``with``) to release file descriptors.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        fragment_bytes: int = 64 << 20,
        fragment_age: float | None = None,
        fsync: bool = False,
        chunk_size: int = 1 << 20,
        poll_interval: float = 0.02,
        recover: bool = True,
    ) -> None:
        if fragment_bytes < 1 or chunk_size < 1 or poll_interval <= 0:
            raise ValueError("fragment_bytes, chunk_size and poll_interval must be positive")
        if fragment_age is not None and fragment_age <= 0:
            raise ValueError("fragment_age must be positive or None")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._fragment_bytes = fragment_bytes
        self._fragment_age = fragment_age
        self._fsync = fsync
        self._chunk_size = chunk_size
        self._poll = poll_interval
        self._states: dict[str, _State] = {}
        self._states_lock = threading.Lock()
        self._cond = threading.Condition()
        self.recovered: builtins.list[RecoveryReport] = []
        """Every non-trivial recovery this instance performed, in order."""
        if recover:
            for spec in self.list(""):
                self.recover(spec.name)

    # -- lifecycle -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Release every file descriptor. The instance must not be used afterwards."""
        with self._states_lock:
            states, self._states = list(self._states.values()), {}
        for st in states:
            with st.lock:
                st.close()

    def __enter__(self) -> FileJournals:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- management ----------------------------------------------------------------------------------

    def _path(self, journal: str) -> Path:
        return self.root.joinpath(*validate_journal_name(journal).split("/"))

    def _existing(self, journal: str) -> Path:
        d = self._path(journal)
        if not (d / META_NAME).is_file():
            raise JournalNotFoundError(f"journal {journal!r} not found under {self.root}")
        return d

    def create(self, spec: JournalSpec, metadata: Mapping[str, str] | None = None) -> None:
        """Create an empty journal directory with its labels and metadata.

        JournalExistsError if the journal exists, or if its directory would sit inside another
        journal's or contain one; ValueError for a bad name or labels.
        """
        labels = validate_labels(spec.name, spec.labels)
        d = self._path(spec.name)
        for parent in d.relative_to(self.root).parents:
            if (self.root / parent / META_NAME).exists():
                raise JournalExistsError(f"journal {spec.name!r} would sit inside journal {parent.as_posix()!r}")
        d.parent.mkdir(parents=True, exist_ok=True)
        try:
            d.mkdir()
        except FileExistsError:
            what = "already exists" if (d / META_NAME).exists() else "collides with a directory of other journals"
            raise JournalExistsError(f"journal {spec.name!r} {what} under {self.root}") from None
        doc = {"name": spec.name, "labels": labels, "metadata": dict(metadata or {}), "created": time.time()}
        self._write_json(d / META_NAME, doc)

    def destroy(self, journal: str) -> None:
        """Delete the journal's directory (fragments, positions, quarantine). JournalNotFoundError if unknown."""
        d = self._existing(journal)
        with self._states_lock:
            st = self._states.pop(journal, None)
        if st is not None:
            with st.lock:
                st.close()
        shutil.rmtree(d)
        parent = d.parent
        while parent != self.root and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent

    def info(self, journal: str) -> JournalInfo:
        doc = self._read_meta(self._existing(journal))
        return JournalInfo(doc["name"], doc["labels"], doc["metadata"])

    def spec(self, journal: str) -> JournalSpec:
        """The journal's name and labels; JournalNotFoundError if unknown."""
        return self.info(journal).spec

    def update_metadata(self, journal: str, metadata: Mapping[str, str]) -> None:
        st = self._state(journal)
        with st.lock, self._flocked(st):
            doc = self._read_meta(st.dir)
            doc["metadata"].update(metadata)
            self._write_json(st.dir / META_NAME, doc)

    def list(self, selector: LabelSelector | str) -> builtins.list[JournalSpec]:
        """Journals under the root whose labels match `selector`, sorted by name."""
        sel = parse_selector(selector) if isinstance(selector, str) else selector
        out: builtins.list[JournalSpec] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [n for n in dirnames if not n.startswith((".", "_"))]
            if META_NAME in filenames:
                dirnames.clear()
                try:
                    doc = self._read_meta(Path(dirpath))
                except FileNotFoundError:
                    continue  # destroyed while listing
                if sel.matches(doc["labels"]):
                    out.append(JournalSpec(doc["name"], doc["labels"]))
        return sorted(out, key=lambda s: s.name)

    @staticmethod
    def _read_meta(d: Path) -> dict[str, Any]:
        with open(d / META_NAME, encoding="utf-8") as f:
            doc: dict[str, Any] = json.load(f)
        return doc

    def _write_json(self, path: Path, doc: object) -> None:
        self._write_atomic(path, json.dumps(doc, sort_keys=True).encode())

    def _write_atomic(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}-{threading.get_ident()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data, 0)
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if self._fsync:
            _fsync_dir(path.parent)

    # -- positions -----------------------------------------------------------------------------------

    def load_position(self, journal: str, group: str) -> int | None:
        path = self._existing(journal) / POSITIONS_DIR / validate_group(group)
        try:
            return int(path.read_text())
        except FileNotFoundError:
            return None

    def store_position(self, journal: str, group: str, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"journal {journal!r}, group {group!r}: negative position {offset}")
        d = self._existing(journal) / POSITIONS_DIR
        d.mkdir(exist_ok=True)
        self._write_atomic(d / validate_group(group), b"%d\n" % offset)

    def positions(self, journal: str) -> dict[str, int]:
        """Every group's durable position in `journal`."""
        d = self._existing(journal) / POSITIONS_DIR
        if not d.is_dir():
            return {}
        return {p.name: int(p.read_text()) for p in d.iterdir() if not p.name.startswith(TMP_PREFIX)}

    # -- writer --------------------------------------------------------------------------------------

    def _state(self, journal: str) -> _State:
        st = self._states.get(journal)
        if st is None:
            d = self._existing(journal)
            with self._states_lock:
                st = self._states.get(journal)
                if st is None:
                    st = self._states[journal] = _State(journal, d)
        return st

    @contextlib.contextmanager
    def _flocked(self, st: _State) -> Iterator[None]:
        fcntl.flock(st.lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(st.lock_fd, fcntl.LOCK_UN)

    def append(self, journal: str, data: bytes) -> AppendResult:
        """Append `data` atomically (see the module docstring); return its [begin, end) byte range."""
        return self.append_many(journal, (data,))[0]

    def append_many(self, journal: str, items: Sequence[bytes]) -> builtins.list[AppendResult]:
        """Append `items` contiguously as one atomic record: readers see all of them or none."""
        payload = b"".join(items)
        st = self._state(journal)
        with st.lock, self._flocked(st):
            self._sync(st)
            begin = st.end
            if payload:
                if st.open_fd is not None and self._aged(st):
                    self._roll(st)
                if st.open_fd is None:
                    self._create_open(st)
                fd = st.open_fd
                assert fd is not None
                rec = pack_record(payload)
                try:
                    _write_all(fd, rec, st.open_size)
                    if self._fsync:
                        os.fsync(fd)
                except BaseException:
                    os.ftruncate(fd, st.open_size)
                    raise
                st.open_size += len(rec)
                st.end += len(payload)
                if st.end - st.open_begin >= self._fragment_bytes:
                    self._roll(st)
        if payload:
            with self._cond:
                self._cond.notify_all()
        return append_results(begin, items)

    def roll(self, journal: str) -> bool:
        """Roll the open fragment of `journal` into a fragment file now; False if it held no data."""
        st = self._state(journal)
        with st.lock, self._flocked(st):
            self._sync(st)
            if st.open_fd is None or st.end == st.open_begin:
                return False
            self._roll(st)
            return True

    def roll_aged(self) -> builtins.list[str]:
        """Roll every open fragment older than ``fragment_age``; return the journals rolled."""
        if self._fragment_age is None:
            return []
        rolled = []
        for spec in self.list(""):
            st = self._state(spec.name)
            with st.lock, self._flocked(st):
                self._sync(st)
                if st.open_fd is not None and st.end > st.open_begin and self._aged(st):
                    self._roll(st)
                    rolled.append(spec.name)
        return rolled

    def recover(self, journal: str) -> RecoveryReport | None:
        """Bring `journal` to a clean state (see the module docstring); return what was done, or None."""
        st = self._state(journal)
        before = len(self.recovered)
        with st.lock, self._flocked(st):
            removed = [n for n in os.listdir(st.dir) if n.startswith(TMP_PREFIX)]
            for n in removed:
                os.unlink(st.dir / n)
            if removed:
                self._report(RecoveryReport(journal, 0, None, tuple(removed)))
            self._sync(st)
        return self.recovered[-1] if len(self.recovered) > before else None

    def _report(self, report: RecoveryReport) -> None:
        log.warning(
            "journal %r recovered: cut %d torn bytes%s; removed %s",
            report.journal,
            report.truncated_bytes,
            f" (quarantined in {report.quarantined})" if report.quarantined else "",
            list(report.removed),
        )
        self.recovered.append(report)

    def _aged(self, st: _State) -> bool:
        return self._fragment_age is not None and time.time() - st.open_created >= self._fragment_age

    def _drop_open(self, st: _State) -> None:
        if st.open_fd is not None:
            os.close(st.open_fd)
        st.open_fd, st.open_ino = None, -1

    def _sync(self, st: _State) -> None:
        """Under the locks: bring the writer state up to date with the directory, recovering torn tails."""
        path = st.dir / OPEN_NAME
        try:
            s = os.stat(path)
        except FileNotFoundError:
            self._drop_open(st)
            st.end = self._fragments_end(st.dir)
            return
        if st.open_fd is not None and s.st_ino == st.open_ino and s.st_size == st.open_size:
            return
        if st.open_fd is None or s.st_ino != st.open_ino or s.st_size < st.open_size:
            self._drop_open(st)
            fd = os.open(path, os.O_RDWR)
            hdr = unpack_header(os.pread(fd, HEADER.size, 0))
            frags_end = self._fragments_end(st.dir)
            if hdr is None or hdr.begin < frags_end:
                # A header-less file cannot be (opens are created by rename), and an open fragment that
                # starts before the last fragment's end was rolled already (crash before its unlink).
                os.close(fd)
                if hdr is None or any(b == hdr.begin for b, _ in self._fragments(st.dir)):
                    os.unlink(path)
                    self._report(RecoveryReport(st.name, 0, None, (OPEN_NAME,)))
                    st.end = frags_end
                    return
                raise JournalError(
                    f"journal {st.name!r} in {st.dir}: open fragment begins at {hdr.begin}, "
                    f"inside fragments ending at {frags_end}"
                )
            if hdr.begin > frags_end:
                os.close(fd)
                raise JournalError(
                    f"journal {st.name!r} in {st.dir}: gap between fragments ending at {frags_end} "
                    f"and open fragment at {hdr.begin}"
                )
            st.open_fd, st.open_ino = fd, s.st_ino
            st.open_begin, st.open_created = hdr.begin, hdr.created
            st.open_size, st.end = HEADER.size, hdr.begin
        fd = st.open_fd
        size = os.fstat(fd).st_size
        pos = st.open_size
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
            st.end += sum(r.size for r in recs)
            pos += used
        st.open_size = pos
        if pos < size:
            self._quarantine(st, pos, size)

    def _quarantine(self, st: _State, pos: int, size: int) -> None:
        fd = st.open_fd
        assert fd is not None
        torn = os.pread(fd, size - pos, pos)
        qdir = st.dir / QUARANTINE_DIR
        qdir.mkdir(exist_ok=True)
        qpath = qdir / f"{st.open_begin:020d}-at-{pos}-{time.time_ns()}.torn"
        qpath.write_bytes(torn)
        os.ftruncate(fd, pos)
        if self._fsync:
            os.fsync(fd)
        self._report(RecoveryReport(st.name, len(torn), qpath, ()))

    def _create_open(self, st: _State) -> None:
        now = time.time()
        tmp = st.dir / f"{TMP_PREFIX}open-{os.getpid()}"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, pack_header(st.end, now), 0)
            if self._fsync:
                os.fsync(fd)
            os.rename(tmp, st.dir / OPEN_NAME)
        except BaseException:
            os.close(fd)
            raise
        st.open_fd, st.open_ino = fd, os.fstat(fd).st_ino
        st.open_begin, st.open_created, st.open_size = st.end, now, HEADER.size

    def _roll(self, st: _State) -> None:
        fd = st.open_fd
        assert fd is not None
        name = fragment_name(st.open_begin, st.end)
        tmp = st.dir / f"{TMP_PREFIX}{name}"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            pos, wpos = HEADER.size, 0
            while pos < st.open_size:
                buf = os.pread(fd, max(self._chunk_size, RECORD.size), pos)
                recs, used = scan_records(buf, pos)
                if not recs:
                    need = RECORD.size + RECORD.unpack_from(buf)[0]
                    buf = os.pread(fd, need, pos)
                    recs, used = scan_records(buf, pos)
                    if not recs:
                        raise JournalError(f"journal {st.name!r}: corrupt record at {OPEN_NAME} position {pos}")
                view = memoryview(buf)
                for r in recs:
                    _write_all(out, view[r.pos - pos : r.pos - pos + r.size], wpos)
                    wpos += r.size
                pos += used
            if wpos != st.end - st.open_begin:
                raise JournalError(
                    f"journal {st.name!r}: rolling {OPEN_NAME} found {wpos} bytes, expected {st.end - st.open_begin}"
                )
            if self._fsync:
                os.fsync(out)
        finally:
            os.close(out)
        os.rename(tmp, st.dir / name)
        os.unlink(st.dir / OPEN_NAME)
        if self._fsync:
            _fsync_dir(st.dir)
        self._drop_open(st)

    # -- reader --------------------------------------------------------------------------------------

    @staticmethod
    def _fragments(d: Path) -> builtins.list[tuple[int, int]]:
        out = []
        for n in os.listdir(d):
            r = parse_fragment_name(n)
            if r is not None:
                out.append(r)
        out.sort()
        return out

    def _fragments_end(self, d: Path) -> int:
        frags = self._fragments(d)
        return frags[-1][1] if frags else 0

    def end(self, journal: str) -> int:
        """The end offset of the bytes currently readable (whole appends only)."""
        st = self._state(journal)
        with st.end_lock:
            cur = st.end_cursor
            try:
                fd = os.open(st.dir / OPEN_NAME, os.O_RDONLY)
            except FileNotFoundError:
                return self._fragments_end(st.dir)
            try:
                for _ in self._open_records(fd, cur, None):
                    pass
            finally:
                os.close(fd)
            return max(cur.jpos, self._fragments_end(st.dir))

    def _open_records(self, fd: int, cur: _Cursor, want: int | None) -> Iterator[tuple[int, memoryview]]:
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

    def read(
        self, journal: str, offset: int, *, block: bool = False, timeout: float | None = None
    ) -> Iterator[tuple[int, bytes]]:
        """The message layer's JournalReader.read over fragments and the open fragment.

        Raises JournalNotFoundError for an unknown journal and OffsetOutOfRangeError if `offset` is
        negative or past the end when the read starts. Chunks never include bytes of an incomplete append.
        """
        end = self.end(journal)
        if offset < 0 or offset > end:
            raise OffsetOutOfRangeError(f"journal {journal!r}: offset {offset} outside [0, {end}]")
        return self._read(self._state(journal), offset, block, timeout)

    def _read(self, st: _State, pos: int, block: bool, timeout: float | None) -> Iterator[tuple[int, bytes]]:
        cur = _Cursor()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            advanced = False
            for begin, chunk in self._available(st, pos, cur):
                yield begin, chunk
                pos = begin + len(chunk)
                advanced = True
            if not block:
                return
            if advanced and timeout is not None:
                deadline = time.monotonic() + timeout
            wait = self._poll
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                wait = min(wait, remaining)
            with self._cond:
                self._cond.wait(wait)

    def _available(self, st: _State, pos: int, cur: _Cursor) -> Iterator[tuple[int, bytes]]:
        """Yield every whole chunk readable now from `pos` on, following roll-overs."""
        relisted = False
        while True:
            covering = next(((b, e) for b, e in self._fragments(st.dir) if b <= pos < e), None)
            if covering is not None:
                b, e = covering
                with open(st.dir / fragment_name(b, e), "rb", buffering=0) as f:
                    f.seek(pos - b)
                    while pos < e:
                        chunk = f.read(min(self._chunk_size, e - pos))
                        if not chunk:
                            raise JournalError(f"journal {st.name!r}: fragment {fragment_name(b, e)} is short")
                        yield pos, chunk
                        pos += len(chunk)
                relisted = False
                continue
            try:
                fd = os.open(st.dir / OPEN_NAME, os.O_RDONLY)
            except FileNotFoundError:
                if relisted:
                    return
                relisted = True  # it may have been rolled between listing and opening: list again
                continue
            try:
                hdr = unpack_header(os.pread(fd, HEADER.size, 0))
                if hdr is None or hdr.begin > pos:
                    if relisted:
                        raise JournalError(f"journal {st.name!r}: no fragment holds offset {pos}")
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
