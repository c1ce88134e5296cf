"""``zcluster markers`` / ``markers reset`` and the migration part of ``zcluster info`` (issue 37, "the guard
decides once": operators see a store's layout markers and reset them safely). Real servers throughout."""

from __future__ import annotations

import itertools
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from cli_helpers import doc, fails, ok

from zcluster import Cluster, LayoutMismatchError
from zcluster.migration import migrate, mover
from zcluster.testing.servers import LocalShards

_names = itertools.count()
WAIT = 120.0


@pytest.fixture
def four() -> Iterator[LocalShards]:  # its own servers: a mover refuses keys of other namespaces
    with LocalShards(4) as s:
        yield s


def at(urls: list[str], prefix: str, *args: str) -> list[str]:
    return [*(a for u in urls for a in ("--url", u)), "--prefix", prefix, *args]


def marker_of(url: str, prefix: str) -> Any:
    with redis.Redis.from_url(url) as r:
        raw = r.get(f"{{{prefix}}}layout")
    return None if raw is None else json.loads(raw)


def test_markers_shows_each_shards_marker_and_no_migration(four: LocalShards) -> None:
    a, b = four.urls[:2]
    pre = f"mk{next(_names)}:"
    with Cluster.from_urls([a, b], prefix=pre, max_size=9) as c:
        c.insert([("k", 1.0, "m")])
    got = doc(at([a, b], pre, "markers"))
    assert got["key"] == f"{{{pre}}}layout" and got["migration"] is None
    first, second = (s["marker"] for s in got["shards"])
    assert first["id"] == second["id"] and [first["index"], second["index"]] == [0, 1]
    assert first["max_size"] == 9 and first["routing"] == "jump" and isinstance(first["created"], float)
    table = ok(at([a, b], pre, "markers")).stdout
    assert first["id"] in table and "2 [" in table
    # listed in another order: shown as it is, with the place it is listed at
    assert "0 (listed 1)" in ok(at([b, a], pre, "markers")).stdout


def test_a_store_no_list_opens_is_shown_and_reset_then_adopted_again(four: LocalShards) -> None:
    # The state two clients of opposite orders left before the guard decided once: each shard marked as the
    # first place of its own list. No list opens it; markers shows why; reset makes it adoptable again.
    a, b = four.urls[:2]
    pre = f"mk{next(_names)}:"
    with Cluster.from_urls([a, b], prefix=pre) as c:
        c.insert([(f"k{i}", 1.0, "m") for i in range(50)])
    other = f"mkother{next(_names)}:"
    with Cluster.from_urls([b, a], prefix=other) as c:
        c.insert([("x", 1.0, "m")])
    with redis.Redis.from_url(b) as r:  # b holds place 0 of [b, a] under another id
        r.set(f"{{{pre}}}layout", json.dumps(marker_of(b, other) | {"prefix": repr(pre)}))
    for urls in ([a, b], [b, a]):
        with pytest.raises(LayoutMismatchError), Cluster.from_urls(urls, prefix=pre) as c:
            c.select(["k1"])
    shown = doc(at([a, b], pre, "markers"))
    assert len({s["marker"]["id"] for s in shown["shards"]}) == 2
    dry = doc(at([a, b], pre, "markers", "reset"))
    assert dry["would_delete"] == [a.rpartition("/")[2], b.rpartition("/")[2]] and dry["deleted"] == []
    assert marker_of(a, pre) is not None
    assert "pass --yes" in ok(at([a, b], pre, "markers", "reset")).stdout
    done = doc(at([a, b], pre, "markers", "reset", "--yes"))
    assert len(done["deleted"]) == 2 and marker_of(a, pre) is None and marker_of(b, pre) is None
    with Cluster.from_urls([a, b], prefix=pre) as c:  # adopted again, after the sample of its keys
        assert len(c.select([f"k{i}" for i in range(50)])) == 50
    assert marker_of(a, pre)["id"] == marker_of(b, pre)["id"]


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """The mover held once it marked the migration (source ``move`` copying, target ``incoming``)."""
    marked, release = threading.Event(), threading.Event()
    original = mover.Migration._copy_and_cut

    def hold(self: mover.Migration, *args: Any) -> Any:
        marked.set()
        assert release.wait(WAIT)
        return original(self, *args)

    monkeypatch.setattr(mover.Migration, "_copy_and_cut", hold)
    yield marked, release
    release.set()


def test_a_migration_under_way_is_shown_and_refuses_a_reset(
    four: LocalShards, held: tuple[threading.Event, threading.Event]
) -> None:
    a, b, c, d = four.urls
    pre = f"mk{next(_names)}:"
    marked, release = held
    with Cluster.from_urls([a, b], prefix=pre) as cluster:
        cluster.insert([(f"k{i}", 1.0, "m") for i in range(50)])
    failed: list[BaseException] = []

    def move() -> None:
        try:
            migrate([a, b], [c, d], prefix=pre, namespaces=[pre])
        except BaseException as exc:  # asserted below
            failed.append(exc)
            marked.set()

    thread = threading.Thread(target=move)
    thread.start()
    try:
        assert marked.wait(WAIT) and not failed, failed
        mig = marker_of(a, pre)["move"]["id"]
        got = doc(at([a, b], pre, "markers"))["migration"]
        assert got["state"] == "copying" and got["id"] == mig and got["to"] == [c, d]
        resume = f"zcluster --url {a} --url {b} --prefix {pre} migrate --namespace {pre} --to {c} --to {d}"
        assert got["resume"] == resume
        # the mover's lease, on the source's first listed shard: this process holds it (migrate runs in a thread)
        holder = got["lease"]["holder"]
        assert holder.split(":")[1] == str(os.getpid()) and got["lease"]["gen"] >= 1, got["lease"]
        assert got["since"] == got["lease"]["since"] and 0 <= got["lease"]["age"] < WAIT
        info = ok(at([a, b], pre, "info", "--no-scan")).stdout
        for text in ("copying", mig, holder, "last heartbeat", "resume with", f"--to {c} --to {d}"):
            assert text in info, text
        target = doc(at([c, d], pre, "markers"))["migration"]  # the target's shards: incoming
        assert target["state"] == "incoming" and target["role"] == "target" and target["lease"]["holder"] == holder
        assert target["resume"] == resume  # the source's list, read from the target's incoming marker
        for urls in ([a, b], [c, d]):
            refused = fails(at(urls, pre, "markers", "reset", "--yes"))
            assert "under way" in refused.stderr and "nothing deleted" in refused.stderr
        assert marker_of(a, pre)["move"]["state"] == "copying" and marker_of(c, pre)["incoming"]["id"] == mig
    finally:
        release.set()
        thread.join(WAIT)
    assert not failed, failed
    # done: the old list's markers refuse a reset (they are what refuses the old list); info says where it went
    refused = fails(at([a, b], pre, "markers", "reset", "--yes"))
    assert "moved the store to" in refused.stderr and marker_of(a, pre)["move"]["state"] == "done"
    info = fails(at([a, b], pre, "info", "--no-scan"), code=2)  # LayoutMovedError: the list is wrong now
    assert "done (the store moved)" in info.stdout and "no longer lives on" in info.stderr
    # a retired server used again: its marker goes with --retired, once its stale copies are deleted
    stale = fails(at([a, b], pre, "markers", "reset", "--retired", "--yes"))
    assert "still holds keys of the prefix" in stale.stderr and marker_of(a, pre) is not None
    for url in (a, b):
        with redis.Redis.from_url(url) as r:
            r.delete(*[k for k in r.scan_iter(match=f"{{{pre}*", count=1000) if not k.endswith(b"}layout")])
    assert len(doc(at([a, b], pre, "markers", "reset", "--retired", "--yes"))["deleted"]) == 2
    assert marker_of(a, pre) is None and marker_of(b, pre) is None


def test_no_password_appears_in_markers_or_their_reset() -> None:
    with LocalShards(2, extra=["--requirepass", "s3cret-pw"]) as s:
        urls = [f"redis://:s3cret-pw@127.0.0.1:{server.port}" for server in s.servers]
        pre = f"mk{next(_names)}:"
        with Cluster.from_urls(urls, prefix=pre) as c:
            c.insert([("k", 1.0, "m")])
        outputs = [
            ok(at(urls, pre, "markers")).output,
            ok(at(urls, pre, "markers", "--json")).output,
            ok(at(urls, pre, "markers", "reset")).output,
        ]
        wrong = fails(at([urls[0], urls[1].replace("s3cret-pw", "wr0ng-pw")], pre, "markers"))
        assert "(unreadable)" in wrong.stdout and "AuthenticationError" in wrong.stderr
        outputs += [wrong.output, wrong.stderr]
        assert all("s3cret-pw" not in text and "wr0ng-pw" not in text for text in outputs), outputs
