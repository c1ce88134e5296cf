"""A consumer of file journals damaged on disk: a fragment file removed, a digit flipped in a sealed
fragment, a journal directory it may not read. Real redis-servers, real files, real permissions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_lost_ranges import committed, mapper, members

from zcluster import Cluster, PollError
from zcluster.journal import FileJournals
from zcluster.journal._filefmt import find_fragment
from zcluster.message import OffsetOutOfRangeError
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.state import Consumer, StateStore
from zcluster.testing import LocalShards


@pytest.fixture
def cluster(shards: LocalShards) -> Iterator[Cluster]:
    with Cluster.from_urls(shards.urls, prefix=f"jd{uuid.uuid4().hex[:8]}:") as c:
        yield c


@pytest.fixture
def app() -> str:
    return f"dmg{uuid.uuid4().hex[:8]}"


def per_append(root: Path, frames: list[bytes], name: str = "j") -> list[tuple[int, int]]:
    """Journal `name` with one fragment file per frame; each frame's range."""
    with FileJournals(root, fragment_bytes=1) as fj:
        fj.create(JournalSpec(name, {"content-type": CONTENT_TYPE_NDJSON}))
        return [(r.begin, r.end) for r in (fj.append(name, f) for f in frames)]


def test_a_removed_middle_fragment_stops_the_consumer_after_everything_before_it(
    tmp_path: Path, cluster: Cluster, app: str
) -> None:
    root = tmp_path / "journals"
    ranges = per_append(root, committed(20))
    b, e = ranges[7]
    store = FileJournals(root, fragment_bytes=1)  # opened before the removal: nothing recovered yet
    (root / "j" / find_fragment(root / "j", b, e)).unlink()
    consumer = Consumer(cluster, store, mapper, app)
    with pytest.raises(PollError) as info:
        consumer.poll()
    (failure,) = info.value.failures
    assert isinstance(failure.error, OffsetOutOfRangeError) and failure.error.lost == (b, e)
    assert failure.offset == b and members(cluster) == sorted(f"m{i}" for i in range(7))
    # fail_on_data_loss=False skips it by itself (another application, its own checkpoint)
    stats = Consumer(cluster, store, mapper, app + "x", fail_on_data_loss=False).poll()
    assert stats.delivered == 19 and stats.lost_skipped == 1 and stats.lost_bytes == e - b
    # an operator skips exactly that range
    StateStore(cluster, app).skip_lost(store, "j", b, e, reason="fragment file removed")
    assert consumer.poll().delivered == 12
    assert StateStore(cluster, app).load_journal("j").offset == store.end("j") == ranges[-1][1]
    store.close()


def test_a_flipped_digit_in_a_sealed_fragment_is_never_delivered(tmp_path: Path, cluster: Cluster, app: str) -> None:
    root = tmp_path / "journals"
    ranges = per_append(root, committed(6))
    path = root / "j" / find_fragment(root / "j", *ranges[3])
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"m3"', b'"m8"'))  # same length: only the checksum can tell
    with FileJournals(root, fragment_bytes=1) as store:
        consumer = Consumer(cluster, store, mapper, app)
        with pytest.raises(PollError) as info:
            consumer.poll()
        assert info.value.failures[0].error.lost == ranges[3]  # type: ignore[attr-defined]
        StateStore(cluster, app).skip_lost(store, "j", *ranges[3])
        consumer.poll()
        assert members(cluster) == ["m0", "m1", "m2", "m4", "m5"]


CHILD = r"""
import json, os, sys
from zcluster import Cluster, Insert, PollError
from zcluster.journal import FileJournals
from zcluster.state import Consumer

root, urls, prefix, app, drop = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1"
# Connected first: the interpreter's own files may be readable by root only (its lazy imports then fail).
with Cluster.from_urls(urls, prefix=prefix) as cluster:
    cluster.select(["k"])
    if drop:  # as a user without root's permission override
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    assert not os.access(os.path.join(root, "b"), os.R_OK)
    out = {}
    fj = FileJournals(root)
    out["unrecovered"] = sorted(getattr(fj, "unrecovered", ["(none kept)"]))
    try:
        out["listed"] = [s.name for s in fj.list("")]
    except Exception as exc:  # told apart by the parent (a JournalListError)
        out["list_error"] = type(exc).__name__
        out["unreadable"], out["listed"] = sorted(exc.unreadable), [s.name for s in exc.listed]
    consumer = Consumer(cluster, fj, lambda m: [Insert("k", 1.0, m.doc["id"])], app)
    try:
        out["poll"], out["delivered"] = "ok", consumer.poll().delivered
    except PollError as exc:
        out["poll"], out["delivered"] = "PollError", exc.stats.delivered
        out["failed"] = [(f.journal, type(f.error).__name__, str(f.error)) for f in exc.failures]
    fj.close()
print(json.dumps(out))
"""


def test_an_unreadable_journal_directory_fails_the_poll_naming_it(shards: LocalShards) -> None:
    base = Path(tempfile.mkdtemp(prefix="zc-unreadable-", dir="/tmp"))  # not under pytest's root-only tmp
    root = base / "journals"
    drop = os.geteuid() == 0  # root reads a mode-000 directory anyway: the child drops to nobody
    try:
        os.chmod(base, 0o755)
        for name in ("a", "b"):
            per_append(root, committed(3), name)
        if drop:
            for d, _, files in os.walk(base):
                os.chown(d, 65534, 65534)
                for f in files:
                    os.chown(os.path.join(d, f), 65534, 65534)
        os.chmod(root / "b", 0)
        prefix, app = f"ur{uuid.uuid4().hex[:8]}:", f"unr{uuid.uuid4().hex[:8]}"
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), "PYTHONDONTWRITEBYTECODE": "1"}
        args = [sys.executable, "-c", CHILD, str(root), json.dumps(shards.urls), prefix, app, "1" if drop else "0"]
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, cwd="/")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        # Opening recovered the readable journal; listing names the unreadable one instead of dropping it.
        assert out["unrecovered"] == ["b"] and out.get("list_error") == "JournalListError"
        assert out["unreadable"] == ["b"] and out["listed"] == ["a"]
        # The poll applied "a" and failed naming "b".
        assert out["poll"] == "PollError" and out["delivered"] == 3
        [(journal, kind, message)] = out["failed"]
        assert journal == "b" and kind == "PermissionError" and str(root / "b") in message
        with Cluster.from_urls(shards.urls, prefix=prefix) as c:
            assert members(c) == ["m0", "m1", "m2"]
    finally:
        if (root / "b").exists():
            os.chmod(root / "b", 0o755)
        shutil.rmtree(base)
