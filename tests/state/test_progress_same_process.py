"""Issue 39 item 5: ``progress()`` in the consumer's own process (where a Prometheus ``ProgressCollector``
runs, given the consumer's journal store) reports damage as a fresh process does.

The state that hid it: a store object's cached scan of the open fragment (where its last look for the end
got to). The open fragment at the consumer's checkpoint cut short by 3 bytes left that store's ``end()`` at
the old end: ``progress(cluster, app, consumer.store)`` said lag 0, no error, and the consumer's next poll
went on from its checkpoint, while a fresh process saw the checkpoint past the journal's end. The cursor is
now checked against the file's size (one fstat it already made). Real Redis servers, a real file journal,
a fresh Python process for the reference verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster, Insert, PollError
from zcluster.journal import FileJournals
from zcluster.journal._filefmt import OPEN_NAME
from zcluster.message import Flags, build_uuid, format_uuid
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.state import Consumer, progress
from zcluster.testing import LocalShards


def _frame(i: int) -> bytes:
    doc = {"UUID": format_uuid(build_uuid(b"\x01" * 6, (100 + i) << 4, Flags.OUTSIDE_TXN)), "id": f"m{i}"}
    return (json.dumps(doc) + "\n").encode()


def _fresh(urls: list[str], prefix: str, app: str, journals: str) -> tuple[Any, ...]:
    """(offset, end, lag_bytes, error, lost) of journal "a" as ``progress`` says in a new Python process."""
    code = (
        "import json, sys; from zcluster import Cluster; from zcluster.state import progress\n"
        "urls, prefix, app, journals = json.loads(sys.argv[1])\n"
        "with Cluster.from_urls(urls, prefix=prefix) as c:\n"
        "    (p,) = progress(c, app, journals)\n"
        "    print(json.dumps([p.offset, p.end, p.lag_bytes, p.error, [list(r) for r in p.lost]]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps([urls, prefix, app, journals])],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    offset, end, lag, error, lost = json.loads(out.stdout)
    return offset, end, lag, error, tuple(tuple(r) for r in lost)


def _seen(p: Any) -> tuple[Any, ...]:
    return p.offset, p.end, p.lag_bytes, p.error, tuple(tuple(r) for r in p.lost)


def test_progress_in_the_consumers_process_sees_the_open_fragment_cut_short(
    shards: LocalShards, tmp_path: Path
) -> None:
    root = tmp_path / "journals"
    url = f"file://{root}"
    app, prefix = f"sp{uuid.uuid4().hex[:8]}", f"sp{uuid.uuid4().hex[:8]}:"
    with FileJournals(root) as writer:
        writer.create(JournalSpec("a", {"content-type": CONTENT_TYPE_NDJSON}))
        for i in range(30):
            writer.append("a", _frame(i))
    with (
        Cluster.from_urls(shards.urls, prefix=prefix) as cluster,
        Consumer(cluster, url, lambda m: [Insert("k", 1.0, m.doc["id"])], app) as consumer,
    ):
        assert consumer.poll().delivered == 30
        (before,) = progress(cluster, app, consumer.store)
        assert before.error is None and before.lag_bytes == 0
        path = root / "a" / OPEN_NAME
        os.truncate(path, path.stat().st_size - 3)  # the fragment holding the checkpoint loses 3 bytes

        fresh = _fresh(shards.urls, prefix, app, url)
        assert fresh[3] is not None and fresh[1] < before.offset  # a fresh process: the checkpoint is past the end
        assert _seen(progress(cluster, app, consumer.store)[0]) == fresh  # the consumer's store object
        assert _seen(progress(cluster, app, url)[0]) == fresh
        with pytest.raises(PollError) as info:  # and the consumer's poll meets it too
            consumer.poll()
        assert "past its end" in str(info.value.failures[0].error)
        assert _seen(progress(cluster, app, consumer.store)[0]) == fresh
