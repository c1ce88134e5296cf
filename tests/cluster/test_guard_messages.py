"""What the layout guard and a migration's followers say (issue 37, "Misleading"): a client idle over a grow
and a shrink back is not told every shard lost its marker; a shard a migration retired, opened alone, says
the store moved (naming where); no public call raises, returns or reports the internal ``StoreMoved`` when a
migration cuts over under it. Real servers and real migrations throughout."""

from __future__ import annotations

import itertools
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from zcluster import Cluster, LayoutMismatchError, LayoutMovedError
from zcluster._moves import StoreMoved
from zcluster.farm import Farm
from zcluster.instrumentation import OpEvent
from zcluster.migration import migrate, mover
from zcluster.state import StateStore
from zcluster.testing.servers import LocalShards

_names = itertools.count()
KEYS = [f"k{i}" for i in range(60)]
WAIT = 120.0  # outer bound of the waits on explicit state


@pytest.fixture
def four() -> Iterator[LocalShards]:  # its own servers: a mover refuses keys of other namespaces
    with LocalShards(4) as s:
        yield s


def test_a_client_idle_over_a_grow_and_a_shrink_back_is_not_told_that_markers_were_lost(
    four: LocalShards, caplog: pytest.LogCaptureFixture
) -> None:
    a, b, c = four.urls[:3]
    pre = f"msg{next(_names)}:"
    with Cluster.from_urls([a, b], prefix=pre) as idle:
        idle.insert([(k, 1.0, "m") for k in KEYS])
        migrate([a, b], [a, b, c], prefix=pre, namespaces=[pre])
        migrate([a, b, c], [a, b], prefix=pre, namespaces=[pre])
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="zcluster"):
            assert idle.insert([(k, 2.0, "m") for k in KEYS]).applied_count == len(KEYS)
        said = [r.getMessage() for r in caplog.records]
        assert not any("lost its marker" in s or "marked again" in s for s in said), said
        back = [s for s in said if "came back onto these shards" in s]
        assert len(back) == 1 and "from 3 shard(s)" in back[0], said
        assert all(v == [(k, 2.0, "m")] for k, v in idle.select(KEYS).items())
    # the shard the shrink retired, opened alone: the store moved (not "a shard was removed")
    with pytest.raises(LayoutMovedError) as e, Cluster.from_urls([c], prefix=pre) as retired:
        retired.select(KEYS[:1])
    assert "a shard was removed" not in str(e.value)
    assert e.value.to == [a, b] and "moved it to 2 standalone shard(s)" in str(e.value)


def test_a_shard_retired_by_a_move_to_other_shards_opened_with_another_list_says_the_store_moved(
    four: LocalShards,
) -> None:
    a, b, c, d = four.urls
    pre = f"msg{next(_names)}:"
    with Cluster.from_urls([a, b], prefix=pre) as first:
        first.insert([(k, 1.0, "m") for k in KEYS])
    migrate([a, b], [c, d], prefix=pre, namespaces=[pre])
    for urls in ([b], [b, a], [a, b, c]):
        with pytest.raises(LayoutMovedError) as e, Cluster.from_urls(urls, prefix=pre) as old:
            old.select(KEYS[:1])
        assert e.value.to == [c, d], urls


def test_the_log_of_a_new_store_names_its_layout_id(four: LocalShards, caplog: pytest.LogCaptureFixture) -> None:
    a, b = four.urls[:2]
    pre = f"msg{next(_names)}:"
    with caplog.at_level(logging.INFO, logger="zcluster"), Cluster.from_urls([a, b], prefix=pre) as c:
        c.insert([("k", 1.0, "m")])
    with redis.Redis.from_url(a) as r:
        layout_id = json.loads(r.get(f"{{{pre}}}layout"))["id"]
    said = [r.getMessage() for r in caplog.records if "marked the new store" in r.getMessage()]
    assert len(said) == 1 and f"layout {layout_id}," in said[0], said  # it said "layout None"


# Every public call of a long-lived client, run once the cut-over is done and before the mover's clean-up:
# each reconnects (the cut-over closed its connections), finds its shards retired, and must follow.
CALLS: dict[str, Callable[[Cluster], Any]] = {
    "select": lambda c: c.select(KEYS[:5]),
    "select_range": lambda c: c.select_range(KEYS[:5]),
    "score": lambda c: c.score([(k, "m") for k in KEYS[:5]]),
    "records": lambda c: c.records(KEYS[:5]),
    "floors_of": lambda c: c.floors_of(KEYS[:5]),
    "fingerprints": lambda c: c.fingerprints(KEYS[:5]),
    "ranks": lambda c: c.ranks([(k, "m") for k in KEYS[:5]]),
    "top": lambda c: c.top(KEYS[:5]),
    "fences": lambda c: c.fences(KEYS[:5]),
    "stats": lambda c: c.stats(),
    "ping": lambda c: c.ping(),
    "insert": lambda c: c.insert([(k, 3.0, "m") for k in KEYS[:5]]),
    "view": lambda c: c.view("other:").select(["x"]),
    "state": lambda c: StateStore(c, "app").committed_batch("q"),
    "farm.select": lambda c: Farm([c]).select(KEYS[:5]),
    "farm.insert": lambda c: Farm([c]).insert([(k, 3.0, "m") for k in KEYS[:5]]),
    "farm.score": lambda c: Farm([c]).score([(k, "m") for k in KEYS[:5]]),
}
SCANS: dict[str, Callable[[Cluster], Any]] = {
    "keys": lambda c: [k for batch in c.keys() for k in batch],
    "scan": lambda c: c.scan(),
    "farm.keys": lambda c: [k for batch in Farm([c]).keys() for k in batch],
}


def every_key(cluster: Cluster) -> list[Any]:
    keys, position = cluster.scan()
    while position is not None:
        more, position = cluster.scan(position)
        keys += more
    return keys


def test_no_public_call_cut_off_by_a_cut_over_raises_or_reports_the_internal_store_moved(
    four: LocalShards, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, c, d = four.urls
    pre = f"msg{next(_names)}:"
    events: list[OpEvent] = []
    clients = {
        name: Cluster.from_urls([a, b], prefix=pre, instrumentation=events.append) for name in {**CALLS, **SCANS}
    }
    cut_over, clean_up = threading.Event(), threading.Event()
    original = mover.Migration._clean_up

    def held(self: mover.Migration, report: Any) -> None:  # the markers say done; the source keeps its copies
        cut_over.set()
        assert clean_up.wait(WAIT)
        original(self, report)

    monkeypatch.setattr(mover.Migration, "_clean_up", held)
    failed: list[BaseException] = []

    def move() -> None:
        try:
            migrate([a, b], [c, d], prefix=pre, namespaces=[pre])
        except BaseException as exc:  # asserted below
            failed.append(exc)
            cut_over.set()

    try:
        clients["select"].insert([(k, 1.0, "m") for k in KEYS])
        for client in clients.values():
            client.ping()  # settled on the source: long-lived clients
        thread = threading.Thread(target=move)
        thread.start()
        assert cut_over.wait(WAIT) and not failed, failed
        got: dict[str, Any] = {}
        for name, call in {**CALLS, **SCANS}.items():
            try:
                got[name] = call(clients[name])
            except Exception as exc:  # asserted below: which error, by call
                got[name] = exc
        clean_up.set()
        thread.join(WAIT)
        assert not thread.is_alive() and not failed, failed
        for name in CALLS:
            assert not isinstance(got[name], Exception), (name, got[name])
            if name not in ("view", "state"):  # a view follows by itself; its cluster at its own next call
                assert clients[name].shards == [u.rpartition("/")[2] for u in (c, d)], name  # it followed
        for name in SCANS:  # a scan cannot carry its position across layouts: a public error, then it works
            assert isinstance(got[name], LayoutMismatchError) and "scan again" in str(got[name]), (name, got[name])
            assert sorted(every_key(clients[name])) == sorted(KEYS), name
        inserted = got["farm.insert"]
        assert inserted.ok and all(r.failures == [] for r in [inserted]), inserted
        assert not [e for e in events if isinstance(e.error, StoreMoved)], [e for e in events if e.error]
    finally:
        clean_up.set()
        for client in clients.values():
            client.close()
