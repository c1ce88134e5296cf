"""Record boundaries of file journals' open fragments, remembered for the whole process.

An open fragment is a run of records with no index: the journal offset at a file position is known only by
scanning records (and checking their CRCs) from a known boundary. Scans note the boundaries they pass, about
one per ``SPACING / 2`` to ``SPACING`` file bytes, so that a later read of offset X starts from the last
boundary at or before X instead of from the fragment's header.

They are kept per process, not per store object, because readers open stores briefly: a Spark sink's task
opens the journal store, reads one range of each journal and closes it, and the next task in the same Python
worker would otherwise scan each open fragment from its start again, a cost that grows with the fragment
(about 0.4 s per read at 48 MiB of one-frame records, measured) until it rolls.

Which boundaries are kept, and why they stay true: only a boundary that a scan found *followed by a whole
record* (or that a writer found holding the directory's lock, with no append under way). Appends are
serialised across threads and processes, and a failed append cuts back only its own record, the last one,
before the next append can start; so a record followed by another one is there for good, and so is the
boundary after it, in that open fragment (named by directory, inode, begin offset and creation time). A
fragment sealed around damage is replaced by a new open fragment, with another name. What this cannot see: an
operator truncating ``.open`` by hand and a writer that never saw the cut bytes appending again (the
journal's offsets are then reused, which its readers cannot be protected from anyway).

Memory stays bounded: the boundaries of the ``JOURNALS`` most recently used journal directories, one open
fragment each, at most ``PER_FRAGMENT`` boundaries each (thinned to every other one past that), 16 bytes a
boundary: at most 16 MiB in all, ~0.5 MiB in a process reading 32 journals of 64 MiB open fragments.
"""

from __future__ import annotations

import bisect
import os
import threading
from array import array
from collections import OrderedDict

SPACING = 1 << 16  # file bytes a scan checks between two chances to note a boundary
PER_FRAGMENT = 4096  # boundaries kept per open fragment, at most
JOURNALS = 256  # journal directories whose boundaries are kept

Fragment = tuple[int, int, float]  # an open fragment's inode, begin offset and creation time

_lock = threading.Lock()
# directory -> (its open fragment, journal offsets, file positions), most recently used last
_marks: OrderedDict[str, tuple[Fragment, array[int], array[int]]] = OrderedDict()


def _after_fork() -> None:  # a child forked while another thread held the lock would wait for ever
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def note(directory: str, fragment: Fragment, jpos: int, fpos: int) -> None:
    """A record boundary of ``fragment`` (the open fragment of ``directory``) at file position ``fpos``,
    journal offset ``jpos``, that is there for good (see the module); kept unless another kept one lies within
    ``SPACING / 2`` bytes. Boundaries of an open fragment created before the one kept are ignored (a reader
    still on a rolled one)."""
    with _lock:
        entry = _marks.get(directory)
        if entry is None or entry[0] != fragment:
            if entry is not None and entry[0][2] > fragment[2]:
                return
            entry = (fragment, array("q"), array("q"))
            _marks[directory] = entry
            if len(_marks) > JOURNALS:
                _marks.popitem(last=False)
        _marks.move_to_end(directory)
        _, offsets, positions = entry
        i = bisect.bisect_left(positions, fpos)
        near = SPACING // 2
        if (i == 0 or fpos - positions[i - 1] >= near) and (i == len(positions) or positions[i] - fpos >= near):
            positions.insert(i, fpos)
            offsets.insert(i, jpos)
            if len(positions) > PER_FRAGMENT:
                del positions[1::2], offsets[1::2]


def before(directory: str, fragment: Fragment, want: int, size: int) -> tuple[int, int] | None:
    """The last boundary (journal offset, file position) of ``fragment`` at or before offset ``want`` within
    its current ``size`` in file bytes, or None when none is known."""
    with _lock:
        entry = _marks.get(directory)
        if entry is None or entry[0] != fragment:
            return None
        _marks.move_to_end(directory)
        _, offsets, positions = entry
        i = bisect.bisect_right(offsets, want)
        while i > 0 and positions[i - 1] > size:  # cut short since (damage): not a boundary now
            i -= 1
        return (offsets[i - 1], positions[i - 1]) if i > 0 else None
