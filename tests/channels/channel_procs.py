"""Child processes for the channel tests (run as ``python channel_procs.py <command> ...``).

Real processes, so that a consumer killed by SIGKILL is exercised for real.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def channel_consume_and_die(backend: str, where: str, prefix: str, channel: str, group: str, n: str) -> None:
    """Consume `n` messages of `channel` in `group`, acknowledge none, print their offsets, die by SIGKILL."""
    from zcluster.channels import Channels
    from zcluster.journal import FileJournals, RedisJournals

    store = FileJournals(where) if backend == "file" else RedisJournals.from_url(where, prefix=prefix)
    ch = Channels(store)
    got = ch.consume(group, channel, int(n))
    print(json.dumps([e.begin for e in got]), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
