"""``zcluster consumers``: applications, progress and lag per journal, skip-lost (real servers and journals)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import doc, fails, ok, rows, run

from zcluster import Cluster, Insert, PollError
from zcluster.journal import FileJournals
from zcluster.journal._filefmt import find_fragment
from zcluster.message import Flags, build_uuid, format_uuid
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.state import Consumer, StateStore
from zcluster.testing import LocalShards


def frame(i: int, producer: bytes = b"\x01" * 6, flags: int = Flags.OUTSIDE_TXN) -> bytes:
    doc = {"UUID": format_uuid(build_uuid(producer, (100 + i) << 4, flags)), "id": f"m{i}"}
    return (json.dumps(doc) + "\n").encode()


def mapper(message: Any) -> list[Insert]:
    return [Insert("k", 1.0, message.doc["id"])]


class Setup:
    """An application stopped before a lost range of journal "j" (and caught up in journal "ok")."""

    def __init__(self, shards: LocalShards, root: Path) -> None:
        self.app = f"cli{uuid.uuid4().hex[:8]}"
        self.root = root
        with FileJournals(root, fragment_bytes=1) as fj:  # a fragment file per append
            for name in ("j", "ok"):
                fj.create(JournalSpec(name, {"content-type": CONTENT_TYPE_NDJSON}))
            ranges = [fj.append("j", frame(i)) for i in range(6)]
            fj.append("ok", frame(0, b"\x02" * 6))
            fj.append("ok", frame(1, b"\x03" * 6, Flags.CONTINUE_TXN))  # a transaction left open
        self.lost = (ranges[2].begin, ranges[2].end)
        path = root / "j" / find_fragment(root / "j", *self.lost)
        path.write_bytes(path.read_bytes()[:-3])
        self.store = FileJournals(root)
        self.cluster = Cluster.from_urls(shards.urls, prefix=f"cli{uuid.uuid4().hex[:8]}:")
        with pytest.raises(PollError):
            Consumer(self.cluster, self.store, mapper, self.app).poll()
        self.conn = [a for u in shards.urls for a in ("--url", u)]
        self.journals = f"file://{root}"

    def __call__(self, *args: str) -> list[str]:
        return [*self.conn, "consumers", *args]


@pytest.fixture
def setup(shards: LocalShards, tmp_path: Path) -> Any:
    s = Setup(shards, tmp_path / "journals")
    yield s
    s.cluster.close()
    s.store.close()


def test_consumers_lists_the_applications_and_shows_each_journals_progress(setup: Setup) -> None:
    listed = doc(setup())["applications"]
    mine = [a for a in listed if a["app"] == setup.app]
    assert mine == [{"app": setup.app, "journals": 2, "lag_bytes": None, "last_moved": None, "problems": None}]
    with_lags = doc(setup("--journals", setup.journals))["applications"]
    (mine_now,) = [a for a in with_lags if a["app"] == setup.app]
    b, e = setup.lost
    assert mine_now["lag_bytes"] == setup.store.end("j") - b and mine_now["problems"] == 1
    assert [setup.app, "2"] == rows(ok(setup()))[[r[0] for r in rows(ok(setup()))].index(setup.app)][:2]

    shown = doc(setup(setup.app, "--journals", setup.journals, "--frames"))
    assert shown["app"] == setup.app
    j, okj = shown["journals"]
    assert (j["journal"], j["offset"], j["end"], j["lag_bytes"], j["lag_frames"]) == (
        "j",
        b,
        setup.store.end("j"),
        setup.store.end("j") - b,
        3,
    )
    assert j["lost"] == [{"begin": b, "end": e, "reason": j["lost"][0]["reason"]}] and "skip-lost j" in j["error"]
    assert (okj["journal"], okj["lag_bytes"], okj["producers"], okj["open_transactions"], okj["error"]) == (
        "ok",
        0,
        2,
        1,
        None,
    )
    assert okj["last_moved"] is not None and okj["skipped"] == []

    table = ok(setup(setup.app, "--journals", setup.journals)).stdout
    assert f"j: lost range {b}..{e} ahead" in table and "stopped before lost range" in table
    assert any(
        r[:4] == ["ok", str(setup.store.end("ok")), str(setup.store.end("ok")), "0"]
        for r in rows(ok(setup(setup.app, "--journals", setup.journals)))
    )
    # Without the journal store: the checkpoints only.
    bare = doc(setup(setup.app))["journals"]
    assert [(x["journal"], x["offset"], x["end"]) for x in bare] == [
        ("j", b, None),
        ("ok", setup.store.end("ok"), None),
    ]
    # A health check: exit 3 while a journal cannot go on or lags too far.
    assert run(setup(setup.app, "--journals", setup.journals, "--max-lag", "1000000")).exit_code == 3
    assert run(setup("--journals", setup.journals, "--max-lag", "1000000")).exit_code == 3
    assert "application" in ok(setup("no-such-app")).stdout


def test_skip_lost_moves_exactly_past_the_lost_range_and_is_audited(setup: Setup) -> None:
    b, e = setup.lost
    env = {"ZCLUSTER_JOURNALS": setup.journals}
    assert "--journals" in fails(setup(setup.app, "skip-lost", "j", "--reason", "x"), code=2).stderr
    assert "--reason" in fails(setup(setup.app, "skip-lost", "j"), code=2, env=env).stderr
    assert (
        "not a lost range"
        in fails(
            setup(setup.app, "skip-lost", "j", "--reason", "x", "--range", f"{b}..{e + 1}"), code=2, env=env
        ).stderr
    )
    assert "at no lost range" in fails(setup(setup.app, "skip-lost", "ok", "--reason", "x"), code=2, env=env).stderr
    assert (
        "not applied yet"
        in fails(
            setup(setup.app + "z", "skip-lost", "j", "--reason", "x", "--range", f"{b}..{e}"), code=2, env=env
        ).stderr
    )
    assert (
        "BEGIN..END"
        in fails(setup(setup.app, "skip-lost", "j", "--reason", "x", "--range", "12"), code=2, env=env).stderr
    )
    assert "skip-lost" in fails(setup(setup.app, "skip", "j"), code=2).stderr
    assert (
        StateStore(setup.cluster, setup.app).load_journal("j").offset == b
        and StateStore(setup.cluster, setup.app).audit() == []
    )

    done = doc(setup(setup.app, "skip-lost", "j", "--reason", "fragment damaged, ticket 9"), env=env)
    assert done == {"app": setup.app, "journal": "j", "begin": b, "end": e, "from": b, "offset": e}
    assert (
        "already past"
        in fails(
            setup(setup.app, "skip-lost", "j", "--reason", "again", "--range", f"{b}..{e}"), code=2, env=env
        ).stderr
    )
    stats = Consumer(setup.cluster, setup.store, mapper, setup.app).poll()
    assert stats.delivered == 3
    (j, _) = doc(setup(setup.app), env=env)["journals"]
    assert j["error"] is None and j["lost"] == [] and j["lag_bytes"] == 0
    (skipped,) = j["skipped"]
    assert (skipped["begin"], skipped["end"], skipped["offset"], skipped["by"], skipped["reason"]) == (
        b,
        e,
        b,
        "operator",
        "fragment damaged, ticket 9",
    )
    assert f"j: lost range {b}..{e} skipped by operator" in ok(setup(setup.app), env=env).stdout
    assert ok(setup(setup.app, "--max-lag", "0"), env=env).exit_code == 0


def test_a_bad_journal_store_url_is_a_usage_error(setup: Setup) -> None:
    assert "--journals" in fails(setup(setup.app, "--journals", "ftp://host/x"), code=2).stderr
    assert "--journals" in fails(setup(setup.app, "--frames"), code=2).stderr
