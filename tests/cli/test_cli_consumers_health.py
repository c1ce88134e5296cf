"""``zcluster consumers`` as a health check (issue 27, items 2, 5, 13b and 14): it reaches the consumer's
verdict on damage not yet recovered, names a corrupt checkpoint and lists the rest, fails for an application
that holds nothing, names a dead shard after the others' answers, and creates nothing. Real servers, real
file journals damaged on disk."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import doc, fails, ok, rows, run

from zcluster import Cluster, ConfigError, InconsistentDataError, Insert, PollError
from zcluster.journal import FileJournals
from zcluster.journal._filefmt import find_fragment
from zcluster.message import Flags, OffsetOutOfRangeError, build_uuid, format_uuid
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.state import Consumer, StateStore, progress
from zcluster.testing import LocalShards


def frame(i: int) -> bytes:
    doc = {"UUID": format_uuid(build_uuid(b"\x01" * 6, (100 + i) << 4, Flags.OUTSIDE_TXN)), "id": f"m{i}"}
    return (json.dumps(doc) + "\n").encode()


def mapper(message: Any) -> list[Insert]:
    return [Insert("k", 1.0, message.doc["id"])]


class Apps:
    """Journals "a" and "b" (a fragment file per append), application ``app`` caught up on "a" at its 2nd frame."""

    def __init__(self, shards: LocalShards, root: Path) -> None:
        self.app = f"h{uuid.uuid4().hex[:8]}"
        self.root = root
        self.prefix = f"h{uuid.uuid4().hex[:8]}:"
        self.cluster = Cluster.from_urls(shards.urls, prefix=self.prefix)
        with FileJournals(root, fragment_bytes=1) as fj:
            for name in ("a", "b"):
                fj.create(JournalSpec(name, {"content-type": CONTENT_TYPE_NDJSON}))
                self.ranges = [fj.append(name, frame(i)) for i in range(2)]
        self.store = FileJournals(root, fragment_bytes=1)
        Consumer(self.cluster, self.store, mapper, self.app).poll()
        self.conn = [*(a for u in shards.urls for a in ("--url", u)), "--prefix", self.prefix]

    def __call__(self, *args: str) -> list[str]:
        return [*self.conn, "consumers", *args]

    def grow(self) -> tuple[int, int]:
        """Append 3 frames to "a" (3 fragment files): a lag of 3; returns the middle fragment's range."""
        added = [self.store.append("a", frame(i)) for i in range(2, 5)]
        return added[1].begin, added[1].end


@pytest.fixture
def apps(shards: LocalShards, tmp_path: Path) -> Iterator[Apps]:
    a = Apps(shards, tmp_path / "journals")
    yield a
    a.cluster.close()
    a.store.close()


@pytest.mark.parametrize("damage", ["truncated", "unreadable"])
def test_the_health_check_reaches_the_consumers_verdict_on_damage_not_yet_recovered(apps: Apps, damage: str) -> None:
    begin, end = apps.grow()
    journals = f"file://{apps.root}"
    assert ok(apps(apps.app, "--journals", journals, "--max-lag", "1000")).exit_code == 0  # healthy: lag only
    path = apps.root / "a" / find_fragment(apps.root / "a", begin, end)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:-3])
    else:  # a file that cannot be read, whoever runs the test (root reads a chmod 000 file)
        path.unlink()
        path.mkdir()
    # The consumer (its store opened before the damage: nothing recovered it) fails the journal every poll.
    consumer = Consumer(apps.cluster, apps.store, mapper, apps.app)
    with pytest.raises(PollError) as info:
        consumer.poll()
    (failure,) = info.value.failures
    assert failure.journal == "a"
    # The health check says so too: exit 3, the error shown; the API alike; the journal left as found.
    listing = sorted(p.name for p in (apps.root / "a").iterdir())
    result = run(apps(apps.app, "--journals", journals, "--max-lag", "1000"))
    assert result.exit_code == 3, (result.stdout, result.stderr)
    (a, b) = doc(apps(apps.app, "--journals", journals))["journals"]
    assert run(apps("--journals", journals, "--max-lag", "1000")).exit_code == 3  # the listing too
    (seen, _) = progress(apps.cluster, apps.app, journals)
    if damage == "truncated":
        # A sealed fragment cut short fails its checksum: the consumer and the view both meet a lost range.
        assert isinstance(failure.error, OffsetOutOfRangeError)
        lost = f"lost range {failure.error.lost_begin}..{failure.error.lost_end} ahead"
        assert lost in result.stdout and a["lost"] and a["journal"] == "a" and b["error"] is None
        assert seen.lost and tuple(seen.lost[0][:2]) == (begin, end)
    else:
        assert "the lag cannot be read" in result.stdout and type(failure.error).__name__ in result.stdout
        assert a["journal"] == "a" and type(failure.error).__name__ in a["error"] and b["error"] is None
        assert seen.error is not None and "the lag cannot be read" in seen.error
    assert sorted(p.name for p in (apps.root / "a").iterdir()) == listing  # nothing recovered, moved or made


def test_a_float_skip_is_refused_and_a_corrupt_checkpoint_is_named_the_rest_listed(
    apps: Apps, shards: LocalShards
) -> None:
    state = StateStore(apps.cluster, apps.app)
    held = state.load_journal("a")
    for begin, end in ((1850.0, 3710.0), (True, 3), (0, "12"), (-1, 4)):
        with pytest.raises(ConfigError, match="must be a non-negative int"):
            state.skip_lost(apps.store, "a", begin, end)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be a non-negative int"):
        state.save_journal("a", 3710.0, [])  # type: ignore[arg-type]
    assert state.load_journal("a") == held and state.audit() == []  # nothing changed

    # A record written by other code (what the float skip used to save): named, the rest listed.
    other = f"{apps.app}x"
    StateStore(apps.cluster, other).save_journal("a", 1, [])
    key = f"{apps.app}/journal/b"
    record = state.cluster.select([key], limit=10)[key][0]
    bad = str(record.member).split("|")
    bad[3] = "3710.0"
    state.cluster.insert([(key, record.score + 1, "|".join(bad))])
    with pytest.raises(InconsistentDataError, match=rf"application {apps.app}, journal b: corrupt checkpoint record"):
        state.load_journal("b")
    journals = f"file://{apps.root}"
    shown = doc(apps(apps.app, "--journals", journals))["journals"]
    assert (shown[0]["journal"], shown[0]["error"]) == ("a", None)
    assert "journal b: corrupt checkpoint record" in shown[1]["error"] and "3710.0" in shown[1]["error"]
    assert run(apps(apps.app, "--journals", journals, "--max-lag", "1000")).exit_code == 3
    listed = {a["app"]: a for a in doc(apps("--journals", journals))["applications"]}
    assert listed[apps.app]["problems"] == 1 and listed[other]["problems"] == 0
    assert run(apps("--journals", journals, "--max-lag", "1000")).exit_code == 3


def test_an_application_with_no_checkpoint_fails_the_health_check(apps: Apps, tmp_path: Path) -> None:
    journals = f"file://{apps.root}"
    for extra in ((), ("--json",)):
        result = fails(apps("typo", "--journals", journals, "--max-lag", "100", *extra), code=3)
        assert "application typo holds no checkpoint" in result.stderr
    assert "no checkpoints" in ok(apps("typo", "--journals", journals)).stdout  # a view, not a check: exit 0
    empty = apps("--namespace", f"none{uuid.uuid4().hex[:6]}:", "--max-lag", "100")
    assert "no application holds checkpoints" in fails(empty, code=3).stderr


def test_a_read_only_view_creates_nothing(apps: Apps, tmp_path: Path) -> None:
    missing = tmp_path / "typo" / "deeper"
    for command in ((apps.app,), ()):
        result = fails(apps(*command, "--journals", f"file://{missing}"), code=2)
        assert f"no journal store at {missing}" in result.stderr
    assert not (tmp_path / "typo").exists()
    with pytest.raises(Exception, match="no journal store"):
        progress(apps.cluster, apps.app, f"file://{missing}")
    assert not (tmp_path / "typo").exists()


def test_a_dead_shard_is_named_after_the_others_answers(tmp_path: Path) -> None:
    with LocalShards(3) as shards:
        apps = Apps(shards, tmp_path / "journals")
        try:
            names = [f"j{i}" for i in range(12)]  # checkpoints spread over the three shards
            for name in names:
                StateStore(apps.cluster, apps.app).save_journal(name, 7, [])
            shards.kill(1)
            dead = shards.servers[1].url.rpartition("/")[2]
            table = fails(apps(apps.app), code=1)
            assert f"shard {dead}" in table.stderr and "not shown" in table.stderr
            shown = {r[0] for r in rows(table) if r and r[0] in {*names, "a", "b"}}
            assert 0 < len(shown) < len(names) + 2, table.stdout  # the others' answers, not the dead shard's
            as_json = fails(apps(apps.app, "--json"), code=1)
            assert {j["journal"] for j in json.loads(as_json.stdout)["journals"]} == shown
            assert all(j["offset"] in (7, apps.ranges[-1].end) for j in json.loads(as_json.stdout)["journals"])
            listing = fails(apps(), code=1)
            assert apps.app in listing.stdout
        finally:
            apps.cluster.close()
            apps.store.close()
            shutil.rmtree(tmp_path / "journals", ignore_errors=True)


def test_a_failed_health_check_names_each_journal_and_why(apps: Apps) -> None:
    """Issue 39, item 6: a journal 114 bytes behind with --max-lag 10 exited 3 while its row said "ok"."""
    apps.grow()
    lag = apps.store.end("a") - apps.ranges[-1].end
    journals = f"file://{apps.root}"
    shown = fails(apps(apps.app, "--journals", journals, "--max-lag", "10"), code=3)
    assert f"Error: journal a lags {lag} bytes, over --max-lag 10" in shown.stderr
    assert "journal b" not in shown.stderr  # caught up: not named
    (row,) = [r for r in rows(shown) if r and r[0] == "a"]
    assert " ".join(row).endswith(f"over --max-lag ({lag} > 10)") and "ok" not in row
    (row_b,) = [r for r in rows(shown) if r and r[0] == "b"]
    assert row_b[-1] == "ok"
    as_json = fails(apps(apps.app, "--journals", journals, "--max-lag", "10", "--json"), code=3)
    assert f"journal a lags {lag} bytes, over --max-lag 10" in as_json.stderr
    listing = fails(apps("--journals", journals, "--max-lag", "10"), code=3)
    assert f"Error: application {apps.app}, journal a lags {lag} bytes, over --max-lag 10" in listing.stderr
    # Under the bound: exit 0, status ok, nothing on stderr.
    passing = ok(apps(apps.app, "--journals", journals, "--max-lag", str(lag)))
    assert passing.stderr == "" and next(r for r in rows(passing) if r and r[0] == "a")[-1] == "ok"
