"""File-fragment journals: the embedded backend, no server needed.

Each journal is a directory under a root (``root/<journal name>/``) laid out as :mod:`._filefmt` describes:
complete fragments ``<begin>-<end>.frag`` plus one hidden open fragment ``.open`` taking appends. This
module is the store: the journals under a root, their metadata and group positions, the locks, when to
roll, blocking reads; :mod:`zcluster.journal._fragments` does the work inside one journal's directory.

Why this module is long: the store's whole contract (management, listing, positions, writer, recovery of
a root journal by journal, blocking reads) is one class; the work inside a directory is elsewhere.

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
* Damage on disk never makes offsets be handed out twice. A fragment file shorter than its name says
  (checked by :meth:`FileJournals.recover`, hence at open) and records of the open fragment that fail
  their CRC (checked whenever a writer scans or rolls it) become *lost ranges*: their bytes are moved or
  copied to ``_quarantine/``, the range is reported (``RecoveryReport.lost``) and stays taken: appends go
  on after it. Valid records after a damaged one are kept at their offsets. Readers get every byte up to
  a lost range, then an OffsetOutOfRangeError naming it and the offset to read on from (reading from
  inside one raises at once).
* Readers read from any offset up to the end, block (in-process appends wake them at once; other
  processes' appends are seen within ``poll_interval``) or stop at the end, and keep reading across
  roll-overs. Durability: with ``fsync=True`` every append, roll and position is fsynced before it
  returns; without it, data survives process crashes but not necessarily power loss.

Not guaranteed: destroying a journal while readers or writers use it (they fail with JournalError or
OSError); fragments written by other tools into the directory.
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from zcluster.journal._filefmt import META_NAME, POSITIONS_DIR, TMP_PREFIX
from zcluster.journal._fragments import JournalDir, LostRange, RecoveryReport, ScanCursor, fsync_dir, write_all
from zcluster.journal.store import (
    JournalInfo,
    append_results,
    validate_group,
    validate_journal_name,
    validate_labels,
)
from zcluster.message.errors import (
    JournalError,
    JournalExistsError,
    JournalListError,
    JournalNotFoundError,
    OffsetOutOfRangeError,
)
from zcluster.message.journals import AppendResult, JournalSpec
from zcluster.message.labels import LabelSelector, parse_selector

__all__ = ["FileJournals", "LostRange", "RecoveryReport"]

log = logging.getLogger(__name__)


class FileJournals:
    """Journals stored as fragment files under `root` (created if missing; with ``create=False`` a missing
    `root` raises JournalNotFoundError instead, for readers that must create nothing); see the module docstring.

    Implements the message layer's JournalWriter/JournalReader/JournalLister and
    :class:`zcluster.journal.store.JournalStore`. Safe for concurrent use by threads; any number of
    processes may open the same root. Call :meth:`close` (or use ``with``) to release file descriptors.
    """

    transient_errors: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)
    """What a retry may cure: the built-in network and timeout errors (e.g. of a network file system). Other
    OSErrors (disk full, permissions) are not retried: they seldom clear within a retry's backoff. A failed
    append leaves nothing behind (the open fragment is cut back), so retrying never duplicates a record."""

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
        create: bool = True,
    ) -> None:
        if fragment_bytes < 1 or chunk_size < 1 or poll_interval <= 0:
            raise ValueError("fragment_bytes, chunk_size and poll_interval must be positive")
        if fragment_age is not None and fragment_age <= 0:
            raise ValueError("fragment_age must be positive or None")
        self.root = Path(root)
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        elif not self.root.is_dir():
            raise JournalNotFoundError(f"no journal store at {self.root}: the directory does not exist")
        self._fragment_bytes = fragment_bytes
        self._fragment_age = fragment_age
        self._fsync = fsync
        self._chunk_size = chunk_size
        self._poll = poll_interval
        self._states: dict[str, JournalDir] = {}
        self._states_lock = threading.Lock()
        self._cond = threading.Condition()
        self.recovered: builtins.list[RecoveryReport] = []
        """Every non-trivial recovery this instance performed, in order."""
        self.unrecovered: dict[str, Exception] = {}
        """The journals (or unreadable directories) the recovery at opening failed for, and why (each logged
        at ERROR). The other journals were recovered: one journal's damage does not close the root. Using
        such a journal fails again (its writers recover it first); listing fails while a directory is
        unreadable (:class:`zcluster.message.JournalListError`)."""
        if recover:
            try:
                specs = self.list("")
            except JournalListError as exc:
                log.error("%s; the other journals are recovered", exc)
                self.unrecovered.update(exc.unreadable)
                specs = exc.listed
            for spec in specs:
                try:
                    self.recover(spec.name)
                except (JournalError, OSError) as exc:
                    log.error("journal %r under %s not recovered (the others are): %s", spec.name, self.root, exc)
                    self.unrecovered[spec.name] = exc

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
        doc = {
            "name": spec.name,
            "labels": labels,
            "metadata": dict(metadata or {}),
            "created": time.time(),
            "uid": uuid.uuid4().hex,
        }
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
        return JournalInfo(doc["name"], doc["labels"], doc["metadata"], doc.get("uid", ""))

    def spec(self, journal: str) -> JournalSpec:
        """The journal's name and labels; JournalNotFoundError if unknown."""
        return self.info(journal).spec

    def update_metadata(self, journal: str, metadata: Mapping[str, str]) -> None:
        st = self._state(journal)
        with st.locked():
            doc = self._read_meta(st.dir)
            doc["metadata"].update(metadata)
            self._write_json(st.dir / META_NAME, doc)

    def list(self, selector: LabelSelector | str) -> builtins.list[JournalSpec]:
        """Journals under the root whose labels match `selector`, sorted by name.

        A directory under the root that cannot be read (e.g. no permission) may hold journals, so nothing
        is dropped silently: :class:`zcluster.message.JournalListError` names each one (its path under the
        root: the journal's name when it is a journal) and carries the journals that could be listed."""
        sel = parse_selector(selector) if isinstance(selector, str) else selector
        out: builtins.list[JournalSpec] = []
        unreadable: dict[str, OSError] = {}

        def failed(exc: OSError, where: str | None = None) -> None:
            path = Path(where or exc.filename or self.root)
            unreadable[path.relative_to(self.root).as_posix() if path.is_relative_to(self.root) else str(path)] = exc

        for dirpath, dirnames, filenames in os.walk(self.root, onerror=failed):
            dirnames[:] = [n for n in dirnames if not n.startswith((".", "_"))]
            if META_NAME in filenames:
                dirnames.clear()
                try:
                    doc = self._read_meta(Path(dirpath))
                except FileNotFoundError:
                    continue  # destroyed while listing
                except OSError as exc:
                    failed(exc, dirpath)
                    continue
                if sel.matches(doc["labels"]):
                    out.append(JournalSpec(doc["name"], doc["labels"]))
        out.sort(key=lambda s: s.name)
        if unreadable:
            what = "; ".join(f"{where} ({exc.strerror or exc})" for where, exc in sorted(unreadable.items()))
            raise JournalListError(
                f"journals under {self.root}: cannot read {what}; the journals there are not listed "
                f"({len(out)} other journal(s) are)",
                unreadable,
                out,
            )
        return out

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
            write_all(fd, data, 0)
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if self._fsync:
            fsync_dir(path.parent)

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

    def _state(self, journal: str) -> JournalDir:
        st = self._states.get(journal)
        if st is None:
            d = self._existing(journal)
            with self._states_lock:
                st = self._states.get(journal)
                if st is None:
                    st = self._states[journal] = JournalDir(
                        journal, d, chunk_size=self._chunk_size, fsync=self._fsync, report=self._report
                    )
        return st

    def append(self, journal: str, data: bytes) -> AppendResult:
        """Append `data` atomically (see the module docstring); return its [begin, end) byte range."""
        return self.append_many(journal, (data,))[0]

    def append_many(self, journal: str, items: Sequence[bytes]) -> builtins.list[AppendResult]:
        """Append `items` contiguously as one atomic record: readers see all of them or none."""
        payload = b"".join(items)
        st = self._state(journal)
        with st.locked():
            st.sync()
            begin = st.end
            if payload:
                if st.open_fd is not None and self._aged(st):
                    st.roll()
                st.append_record(payload)
                if st.end - st.open_begin >= self._fragment_bytes:
                    st.roll()
        if payload:
            with self._cond:
                self._cond.notify_all()
        return append_results(begin, items)

    def roll(self, journal: str) -> bool:
        """Roll the open fragment of `journal` into a fragment file now; False if it held no data."""
        st = self._state(journal)
        with st.locked():
            st.sync()
            if st.open_fd is None or st.end == st.open_begin:
                return False
            st.roll()
            return True

    def roll_aged(self) -> builtins.list[str]:
        """Roll every open fragment older than ``fragment_age``; return the journals rolled."""
        if self._fragment_age is None:
            return []
        rolled = []
        for spec in self.list(""):
            st = self._state(spec.name)
            with st.locked():
                st.sync()
                if st.open_fd is not None and st.end > st.open_begin and self._aged(st):
                    st.roll()
                    rolled.append(spec.name)
        return rolled

    def recover(self, journal: str) -> RecoveryReport | None:
        """Bring `journal` to a clean state (see the module docstring); return what was done, or None."""
        st = self._state(journal)
        before = len(self.recovered)
        with st.locked():
            st.remove_temporaries()
            st.check_fragments()
            st.sync()
            st.mark_gaps()
        return self.recovered[-1] if len(self.recovered) > before else None

    def lost_ranges(self, journal: str) -> builtins.list[LostRange]:
        """The lost ranges of `journal` (see the module docstring), in offset order (zcluster.state.lost)."""
        return self._state(journal).lost_ranges()

    def _report(self, report: RecoveryReport) -> None:
        log.warning(
            "journal %r recovered: cut %d torn bytes%s; removed %s; lost ranges %s (their offsets are not reused)",
            report.journal,
            report.truncated_bytes,
            f" (quarantined in {report.quarantined})" if report.quarantined else "",
            list(report.removed),
            [f"{b}..{e}" for b, e in report.lost],
        )
        self.recovered.append(report)

    def _aged(self, st: JournalDir) -> bool:
        return self._fragment_age is not None and time.time() - st.open_created >= self._fragment_age

    # -- reader --------------------------------------------------------------------------------------

    def end(self, journal: str) -> int:
        """The end offset of the bytes currently readable (whole appends only)."""
        return self._state(journal).readable_end()

    def read(
        self, journal: str, offset: int, *, block: bool = False, timeout: float | None = None
    ) -> Iterator[tuple[int, bytes]]:
        """The message layer's JournalReader.read over fragments and the open fragment.

        Raises JournalNotFoundError for an unknown journal and OffsetOutOfRangeError if `offset` is
        negative or past the end when the read starts, or lies in a lost range. Chunks never include bytes
        of an incomplete append. A read reaching a lost range raises OffsetOutOfRangeError there, naming
        the range and the offset to read on from.
        """
        st = self._state(journal)
        if not st.readable(offset):  # scans the open fragment only for an offset past the sealed pieces
            raise OffsetOutOfRangeError(f"journal {journal!r}: offset {offset} outside [0, {st.readable_end()}]")
        lost = st.lost_error(offset)
        if lost is not None:
            raise lost
        return self._read(st, offset, block, timeout)

    def _read(self, st: JournalDir, pos: int, block: bool, timeout: float | None) -> Iterator[tuple[int, bytes]]:
        cur = ScanCursor()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            advanced = False
            for begin, chunk in st.available(pos, cur):
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
