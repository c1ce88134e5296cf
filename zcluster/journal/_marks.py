"""Record boundaries of file journals' open fragments, remembered for the whole process.

An open fragment is a run of records with no index: the journal offset at a file position is known only by
scanning records (and checking their CRCs) from a known boundary. Every scan notes the boundaries it passes,
about one per ``SPACING`` file bytes, so that a later read of offset X starts from the last boundary at or
before X instead of from the fragment's header.

The boundaries are kept per process, not per store object, because readers open stores briefly: a Spark
sink's task opens the journal store, reads one range of each journal and closes it, and the next task in the
same Python worker would otherwise scan each open fragment from its start again, a cost that grows with the
fragment (about 120 ms per read at 24 MiB of one-frame records, measured) until it rolls.

What a boundary is worth: it was the end of a CRC-valid record when a scan passed it, in the open fragment
named by (directory, inode, begin offset, creation time). A writer appends past it, or cuts back the end of
the file (a torn or failed append), so a boundary within the file's current size is trusted as one, as one
store object trusted its own scans' boundaries before; an open fragment sealed around damage is replaced by
a new one, with another name. Memory stays bounded: the boundaries of the
``JOURNALS`` most recently scanned journal directories are kept, one open fragment each (about 16 bytes per
boundary, at most ~1,000 for a 64 MiB fragment).
"""

from __future__ import annotations

import bisect
import threading
from array import array
from collections import OrderedDict

SPACING = 1 << 16  # file bytes between remembered boundaries
JOURNALS = 512  # journal directories whose boundaries are kept

Fragment = tuple[int, int, float]  # an open fragment's inode, begin offset and creation time

_lock = threading.Lock()
# directory -> (its open fragment, journal offsets, file positions), most recently used last
_marks: OrderedDict[str, tuple[Fragment, array[int], array[int]]] = OrderedDict()


def note(directory: str, fragment: Fragment, jpos: int, fpos: int) -> None:
    """A scan of ``fragment`` (the open fragment of ``directory``) found a record boundary at file position
    ``fpos``, journal offset ``jpos``; kept unless another kept one lies within ``SPACING`` bytes."""
    with _lock:
        entry = _marks.get(directory)
        if entry is None or entry[0] != fragment:  # a new open fragment: the old one's boundaries are gone
            entry = (fragment, array("q"), array("q"))
            _marks[directory] = entry
            if len(_marks) > JOURNALS:
                _marks.popitem(last=False)
        _marks.move_to_end(directory)
        _, offsets, positions = entry
        i = bisect.bisect_left(positions, fpos)
        if (i == 0 or fpos - positions[i - 1] >= SPACING) and (i == len(positions) or positions[i] - fpos >= SPACING):
            positions.insert(i, fpos)
            offsets.insert(i, jpos)


def before(directory: str, fragment: Fragment, want: int, size: int) -> tuple[int, int] | None:
    """The last boundary (journal offset, file position) of ``fragment`` at or before offset ``want`` within
    its current ``size`` in file bytes, or None when none is known."""
    with _lock:
        entry = _marks.get(directory)
        if entry is None or entry[0] != fragment:
            return None
        _, offsets, positions = entry
        i = bisect.bisect_right(offsets, want)
        while i > 0 and positions[i - 1] > size:  # cut short since (damage): not a boundary now
            i -= 1
        return (offsets[i - 1], positions[i - 1]) if i > 0 else None
