"""The layout guard decides once (issue 37, item 4): clients opening an empty store at the same moment with
the same shards in two orders ([A, B] and [B, A], two layouts) end with exactly one layout on every shard;
the other list is refused (reordered) and the winner works. A deterministic scheduler drives every
interleaving of the guards' marker creations; a stress test runs the real race. Real servers throughout."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from zcluster import Cluster, LayoutMismatchError
from zcluster._guard import LayoutGuard
from zcluster._keys import KeyLayout
from zcluster._markers import marker_key
from zcluster.testing.servers import LocalShards

_names = itertools.count()
WAIT = 60.0  # generous outer bound of every wait: a failure, not a timing assumption


@pytest.fixture(scope="module")
def three() -> Iterator[LocalShards]:
    with LocalShards(3) as s:
        yield s


def by_name(shards: LocalShards) -> list[str]:
    """The URLs in the order of their shard names (``host:port``, the guard's deciding order)."""
    return sorted(shards.urls, key=lambda u: u.rpartition("/")[2])


def markers(urls: list[str], prefix: str) -> list[dict[str, Any] | None]:
    out = []
    for url in urls:
        with redis.Redis.from_url(url) as r:
            raw = r.get(marker_key(KeyLayout(prefix)))
        out.append(None if raw is None else json.loads(raw))
    return out


def opens(urls: list[str], prefix: str) -> BaseException | None:
    """None when a new client of ``urls`` reads and writes the store, else what it raised."""
    try:
        with Cluster.from_urls(urls, prefix=prefix) as c:
            c.insert([("k", 1.0, "m")])
            c.select(["k", "other"])
    except LayoutMismatchError as exc:
        return exc
    return None


class Turns:
    """A deterministic scheduler of the guards' marker creations: ``schedule`` lists whose create runs
    next (a client's label); a client that finished (won or was refused) gives up its remaining turns."""

    def __init__(self, schedule: list[str]) -> None:
        self.schedule = list(schedule)
        self.done: set[str] = set()
        self.cond = threading.Condition()
        self.ran: list[str] = []

    def _head(self) -> str | None:
        while self.schedule and self.schedule[0] in self.done:
            self.schedule.pop(0)
        return self.schedule[0] if self.schedule else None

    def begin(self, who: str) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self._head() in (who, None), timeout=WAIT), (who, self.schedule)

    def end(self, who: str) -> None:
        with self.cond:
            if self._head() == who:
                self.schedule.pop(0)
            self.ran.append(who)
            self.cond.notify_all()

    def finish(self, who: str) -> None:
        with self.cond:
            self.done.add(who)
            self.cond.notify_all()


def scheduled(monkeypatch: pytest.MonkeyPatch, turns: Turns, clients: int) -> dict[int, str]:
    """Make every labelled guard (the returned map: ``id(guard)`` to its client's label, filled by
    :func:`first_uses`) wait for its turn before each marker creation, and all ``clients`` enter their
    adoption (all markers read: none) before any of them creates one."""
    create, adopt = LayoutGuard._create, LayoutGuard._adopt
    entered = threading.Barrier(clients, timeout=WAIT)
    labels: dict[int, str] = {}

    def scheduled_create(self: LayoutGuard, j: int, target: Any, value: str) -> dict[str, Any]:
        who = labels.get(id(self))
        if who is None:
            return create(self, j, target, value)
        turns.begin(who)
        try:
            return create(self, j, target, value)
        finally:
            turns.end(who)

    def synchronized_adopt(self: LayoutGuard, targets: dict[int, Any]) -> None:
        if id(self) in labels:
            entered.wait()  # every client saw an empty store: the race the issue names
        adopt(self, targets)

    monkeypatch.setattr(LayoutGuard, "_create", scheduled_create)
    monkeypatch.setattr(LayoutGuard, "_adopt", synchronized_adopt)
    return labels


def first_uses(
    lists: dict[str, list[str]], prefix: str, turns: Turns | None = None, labels: dict[int, str] | None = None
) -> dict[str, BaseException | None]:
    """Each list's first call, in its own thread, released together; what each raised (None: it worked)."""
    out: dict[str, BaseException | None] = {}
    barrier = threading.Barrier(len(lists), timeout=WAIT)

    def first_use(who: str, urls: list[str]) -> None:
        try:
            with Cluster.from_urls(urls, prefix=prefix) as c:
                if labels is not None:
                    labels[id(c._transport.guard)] = who
                barrier.wait()
                c.insert([(f"k{i}", 1.0, "m") for i in range(20)])
            out[who] = None
        except BaseException as exc:  # collected and asserted by the test
            out[who] = exc
        finally:
            if turns is not None:
                turns.finish(who)

    threads = [threading.Thread(target=first_use, args=item) for item in lists.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()
    return out


def interleavings(*labels: str, each: int = 2) -> list[list[str]]:
    return sorted({p for p in itertools.permutations([x for x in labels for _ in range(each)])})  # type: ignore[misc]


@pytest.mark.parametrize("schedule", interleavings("ab", "ba"), ids=lambda s: "-".join(s))
def test_two_orders_racing_on_an_empty_store_leave_exactly_one_layout_on_every_shard(
    three: LocalShards, monkeypatch: pytest.MonkeyPatch, schedule: list[str]
) -> None:
    a, b = three.urls[:2]
    pre = f"once{next(_names)}:"
    lists = {"ab": [a, b], "ba": [b, a]}
    turns = Turns(schedule)
    got = first_uses(lists, pre, turns, scheduled(monkeypatch, turns, len(lists)))
    monkeypatch.undo()
    winners = [who for who, exc in got.items() if exc is None]
    assert len(winners) == 1, got
    loser = next(who for who in lists if who not in winners)
    assert isinstance(got[loser], LayoutMismatchError) and "reordered" in str(got[loser])
    found = markers(lists[winners[0]], pre)
    assert all(m is not None for m in found) and len({m["id"] for m in found if m is not None}) == 1
    assert [m["index"] for m in found if m is not None] == [0, 1]
    assert opens(lists[winners[0]], pre) is None
    refused = opens(lists[loser], pre)
    assert refused is not None and "reordered" in str(refused)


def test_a_loser_of_another_list_removes_the_markers_it_made(
    three: LocalShards, monkeypatch: pytest.MonkeyPatch
) -> None:
    # s0 < s1 < s2 by name. [s0, s1] marks s0 first; [s1, s2] wins s1; the first must not leave s0 marked.
    s0, s1, s2 = by_name(three)
    pre = f"once{next(_names)}:"
    lists = {"first": [s0, s1], "second": [s1, s2]}
    turns = Turns(["first", "second", "first", "second"])
    got = first_uses(lists, pre, turns, scheduled(monkeypatch, turns, len(lists)))
    monkeypatch.undo()
    assert got["second"] is None and isinstance(got["first"], LayoutMismatchError), got
    assert turns.ran[:3] == ["first", "second", "first"]  # the interleaving the test is about did run
    assert markers([s0], pre) == [None]
    assert opens([s1, s2], pre) is None


def test_three_clients_of_two_orders_agree_in_every_interleaving(
    three: LocalShards, monkeypatch: pytest.MonkeyPatch
) -> None:
    # x and z list [A, B], y lists [B, A]: in each of the 90 interleavings of their marker creations either x
    # and z both work (one layout, one id) and y is refused, or y works and both others are refused.
    a, b = three.urls[:2]
    lists = {"x": [a, b], "y": [b, a], "z": [a, b]}
    outcomes = set()
    for schedule in interleavings("x", "y", "z"):
        pre = f"once{next(_names)}:"
        turns = Turns(schedule)
        got = first_uses(lists, pre, turns, scheduled(monkeypatch, turns, len(lists)))
        monkeypatch.undo()
        worked = "".join(sorted(who for who, exc in got.items() if exc is None))
        assert worked in ("xz", "y"), (schedule, got)
        assert all(isinstance(exc, LayoutMismatchError) for exc in got.values() if exc is not None), got
        found = markers([a, b], pre)
        assert all(m is not None for m in found) and len({m["id"] for m in found if m is not None}) == 1
        assert [m["index"] for m in found if m is not None] == ([0, 1] if worked == "xz" else [1, 0])
        outcomes.add(worked)
    assert outcomes == {"xz", "y"}  # both orders won some interleaving: the schedules did drive the race


@pytest.mark.parametrize("rounds", [20])
def test_the_real_race_always_leaves_a_store_exactly_one_list_opens(three: LocalShards, rounds: int) -> None:
    a, b = three.urls[:2]
    for _ in range(rounds):
        pre = f"once{next(_names)}:"
        lists = {"ab": [a, b], "ba": [b, a]}
        got = first_uses(lists, pre)
        assert sum(exc is None for exc in got.values()) == 1, got
        assert all(exc is None or isinstance(exc, LayoutMismatchError) for exc in got.values()), got
        assert sorted(opens(urls, pre) is None for urls in lists.values()) == [False, True]
