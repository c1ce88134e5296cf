"""Child processes for the journal tests (run as ``python journal_procs.py <command> ...``).

Real processes, so that crash cases (SIGKILL) and cross-process locking are exercised for real.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def file_append(root: str, journal: str, tag: str, count: str) -> None:
    """Append `count` records ``<tag>:<i>;`` padded to vary sizes, one append per record."""
    from zcluster.journal import FileJournals

    with FileJournals(root, fragment_bytes=4096, recover=False) as fj:
        for i in range(int(count)):
            fj.append(journal, f"<{tag}:{i}:{'x' * (i % 37)}>".encode())


def file_crash_mid_append(root: str, journal: str) -> None:
    """Append one whole record, then die by SIGKILL after writing half of the next one."""
    from zcluster.journal import FileJournals
    from zcluster.journal import _fragments as fragments

    with FileJournals(root, recover=False) as fj:
        fj.append(journal, b"whole-1\n")
        real = fragments.write_all

        def torn(fd: int, data: bytes | memoryview, pos: int) -> None:
            real(fd, bytes(data)[: len(data) // 2], pos)
            os.kill(os.getpid(), signal.SIGKILL)

        fragments.write_all = torn
        fj.append(journal, b"torn-record-that-never-completes\n" * 4)


def stream_group_consume_and_die(url: str, cluster: str, prefix: str, journal: str, group: str, n: str) -> None:
    """Read `n` entries with XREADGROUP as consumer 'doomed', print their ids, and die without acking."""
    from zcluster.journal import RedisJournals

    rj = RedisJournals.from_url(url, prefix=prefix, cluster=cluster == "cluster")
    entries = rj.group_read(journal, group, "doomed", count=int(n))
    print(json.dumps([e.id for e in entries]), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
