"""Exactly-once chains: a Consumer publishing derived messages downstream with ACK intents in its checkpoint
(:mod:`zcluster.state.txn`), on real redis-server processes, with file journals and Redis Streams journals.

Stage A (tests/state/chain_helpers.py) reads events, counts them and publishes one derived message each;
stage B reads A's output read-committed into a leaderboard. Every test compares the leaderboard with the
model (each input event's points, once) and checks that its fault really happened where it matters (the
process died with the checkpoint saved and its ACKs missing, the zombie's messages are in the journal
uncommitted, one journal of two got its ACK, the downstream reader saw the rollback).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import redis
from chain_helpers import (
    A_SELECTOR,
    B_SELECTOR,
    OUTPUTS,
    board,
    create,
    events,
    feed,
    model,
    stage_a,
    stage_b,
)
from click.testing import CliRunner
from test_increments_faults import AOF_ALWAYS

from zcluster import Cluster, ConfigError, FencedError, MapperError, PollError
from zcluster.cli import cli
from zcluster.journal import FileJournals, RedisJournals
from zcluster.journal.store import JournalStore
from zcluster.message import JournalError
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.message.readers import ReadCommittedIter, ReadUncommittedIter
from zcluster.message.sequencer import Sequencer
from zcluster.state import Consumer, StateStore, progress, txn
from zcluster.state.txn import TxnStore
from zcluster.testing import LocalShards

_ids = itertools.count()
HELPER = Path(__file__).with_name("chain_helpers.py")


class Env:
    def __init__(self, url: str, store: Any, shards: LocalShards) -> None:
        self.url, self.store, self.shards = url, store, shards
        self.prefix = f"ch{next(_ids)}:"
        self.app_a, self.app_b = f"a{next(_ids)}", f"b{next(_ids)}"
        self.cluster = Cluster.from_urls(shards.urls, prefix=self.prefix)

    def a(self, store: JournalStore | None = None, mapper: Any = stage_a) -> Consumer:
        return Consumer(self.cluster, self.store, mapper, self.app_a, selector=A_SELECTOR, publish=store or self.store)

    def b(self) -> Consumer:
        return Consumer(self.cluster, self.store, stage_b, self.app_b, selector=B_SELECTOR)

    def run_a(self, die_at: str, *more: int) -> subprocess.CompletedProcess[str]:
        """Stage A in a subprocess (see chain_helpers.main)."""
        args = [",".join(self.shards.urls), self.prefix, self.url, self.app_a, die_at, *map(str, more)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HELPER.parent), *sys.path])}
        return subprocess.run(
            [sys.executable, str(HELPER), *args], capture_output=True, text=True, timeout=300, env=env, check=False
        )

    def read(self, journal: str, committed: bool) -> list[Any]:
        spec = JournalSpec(journal, {"content-type": CONTENT_TYPE_NDJSON})
        it = ReadCommittedIter(self.store, spec, Sequencer()) if committed else ReadUncommittedIter(self.store, spec)
        return [e for e in it if not e.is_ack]


def chain_journals(kind: str, tmp_path: Path, shards: LocalShards) -> tuple[str, Any]:
    """The chain's journals (created): file journals, or Redis Streams journals on the first shard."""
    if kind == "file":
        url = str(tmp_path / "journals")
        store: Any = FileJournals(url)
    else:
        url = f"{shards.urls[0]}?prefix=chj{next(_ids)}:"
        store = RedisJournals.from_url(url)
    create(store)
    return url, store


def test_chain_counts_each_input_once(env: Env) -> None:
    docs = events(0, 40)
    feed(env.store, docs)
    with env.a() as a:
        stats = a.poll()
    assert stats.published == 40 and stats.delivered == 40
    # What B reads read-committed is exactly the derived messages, once each.
    derived = [e.message.doc["src"] for j in OUTPUTS for e in env.read(j, committed=True)]
    assert sorted(derived) == list(range(40))
    env.b().poll()
    assert board(env.cluster) == model(docs)
    # A second run of A (a restart) publishes nothing again; more input goes through once.
    more = events(40, 25)
    feed(env.store, more)
    with env.a() as a:
        assert a.poll().published == 25
        assert a.poll().published == 0
    env.b().poll()
    assert board(env.cluster) == model(docs + more)
    checkpoint = TxnStore(StateStore(env.cluster, env.app_a)).load("in/0")
    assert checkpoint.gen == 2 and checkpoint.intents  # two claims; the last transaction's intents are kept


def test_crash_between_checkpoint_and_acks(env: Env) -> None:
    docs = events(0, 30)
    feed(env.store, docs)
    died = env.run_a("acks")
    assert died.returncode == -9, died.stderr  # SIGKILLed at its first ACK append, the checkpoint saved
    held = TxnStore(StateStore(env.cluster, env.app_a)).load("in/0")
    assert held.offset > 0 and held.intents  # saved, with intents never appended
    assert sum(len(env.read(j, committed=False)) for j in OUTPUTS) > 0
    env.b().poll()
    assert board(env.cluster) != model(docs)  # B cannot see the transaction yet: its ACK was lost
    # The consumers view shows the intents the checkpoint holds (the library's and the CLI's).
    (shown,) = [p for p in progress(env.cluster, env.app_a, env.store) if p.journal == "in/0"]
    assert set(shown.ack_intents) == {i.journal for i in held.intents} and shown.generation == 1
    conn = [a for u in env.shards.urls for a in ("--url", u)]
    listed = CliRunner().invoke(cli, [*conn, "consumers", env.app_a, "--journals", env.url, "--json"])
    assert listed.exit_code == 0, listed.output
    (row,) = [j for j in json.loads(listed.stdout)["journals"] if j["journal"] == "in/0"]
    assert sorted(row["ack_intents"]) == sorted(shown.ack_intents)
    text = CliRunner().invoke(cli, [*conn, "consumers", env.app_a, "--journals", env.url]).stdout
    assert "in/0: ACK intents for" in text
    with env.a() as a:  # restart: the claim re-appends the intents, then A goes on
        a.poll()
    env.b().poll()
    assert board(env.cluster) == model(docs)
    more = events(30, 12)
    feed(env.store, more)
    with env.a() as a:
        a.poll()
    env.b().poll()
    assert board(env.cluster) == model(docs + more)


def test_abandoned_transaction_is_rolled_back_in_a_later_poll_downstream(env: Env) -> None:
    docs = events(0, 20)
    feed(env.store, docs)
    died = env.run_a("save", 14, 20)  # poll 1 commits events 0..19; poll 2 publishes 20..33, dies before saving
    assert died.returncode == -9, died.stderr
    more = events(20, 14)
    pending = sum(len(env.read(j, committed=False)) for j in OUTPUTS)
    assert pending == 20 + 7  # in/0's abandoned transaction (7 of the 14 events) is in the journals, uncommitted
    with env.b() as b:
        first = b.poll()
        assert board(env.cluster) == model(docs)  # only the committed transaction
        assert first.rollbacks == 0
        with env.a() as a:  # restart: re-appending the last checkpoint's intents rolls the abandoned span back
            a.poll()
        later = b.poll()
    assert later.rollbacks >= 1
    assert board(env.cluster) == model(docs + more)
    # Read-committed, each derived message is there exactly once (the abandoned copies rolled back).
    derived = sorted(e.message.doc["src"] for j in OUTPUTS for e in env.read(j, committed=True))
    assert derived == list(range(34))


def test_zombie_late_publish_never_commits(env: Env) -> None:
    docs = events(0, 10)
    feed(env.store, docs)
    with env.a() as a:
        a.poll()
    late = events(10, 10)
    feed(env.store, late)
    entered, release = threading.Event(), threading.Event()

    def slow(message: Any) -> list[Any]:
        if message.doc["id"] == 15:
            entered.set()
            assert release.wait(120)
        return stage_a(message)

    # The zombie claims the journals and is paused inside its transaction; a replacement claims them in turn
    # and finishes the work; then the zombie goes on, publishes its messages and tries to save.
    zombie = env.a(mapper=slow)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            zombie.poll()
        except BaseException as exc:
            failures.append(exc)

    t = threading.Thread(target=run)
    t.start()
    assert entered.wait(120)
    with env.a() as replacement:
        replacement.poll()
    release.set()
    t.join(120)
    assert failures and isinstance(failures[0], PollError)
    assert any(isinstance(f.error, FencedError) for f in failures[0].failures)
    committed = sum(len(env.read(j, committed=True)) for j in OUTPUTS)
    uncommitted = sum(len(env.read(j, committed=False)) for j in OUTPUTS)
    assert committed == 20 and uncommitted > committed  # the zombie's messages are there, never committed
    env.b().poll()
    assert board(env.cluster) == model(docs + late)


class FailingIntents:
    """A journal store whose ``fail``-th ``append`` (ACK intents go through append, messages through
    append_many) raises, after appending nothing."""

    def __init__(self, store: Any, fail: int) -> None:
        self.store, self.fail, self.calls = store, fail, 0

    def append(self, journal: str, data: bytes) -> Any:
        self.calls += 1
        if self.calls == self.fail:
            raise JournalError(f"journal {journal}: injected append failure")
        return self.store.append(journal, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_intents_interrupted_mid_append_finish_after_restart(env: Env) -> None:
    docs = events(0, 14)  # users u0..u6 reach both output journals
    feed(env.store, docs)
    failing = FailingIntents(env.store, fail=2)
    with env.a(store=failing) as a, pytest.raises(PollError):
        a.poll()
    assert failing.calls >= 2
    pending = [len(env.read(j, committed=False)) - len(env.read(j, committed=True)) for j in OUTPUTS]
    assert sorted(p > 0 for p in pending) == [False, True]  # in/0's ACK reached one journal, not the other
    with env.a() as a:  # restart: both intents appended again (a duplicate ACK changes nothing)
        a.poll()
    env.b().poll()
    assert board(env.cluster) == model(docs)


def test_a_non_publishing_save_over_a_publishing_checkpoint_is_refused(env: Env) -> None:
    feed(env.store, events(0, 4))
    with env.a() as a:
        a.poll()
    state = StateStore(env.cluster, env.app_a)
    held = state.load_journal("in/0")
    assert held.offset > 0  # the v4 record reads as a checkpoint
    with pytest.raises(ConfigError, match="publishing application"):
        state.save_journal("in/0", held.offset + 1, held.states)


def test_a_publish_without_a_journal_store_to_publish_to_is_a_mapper_error(env: Env) -> None:
    feed(env.store, events(0, 2))
    with (
        Consumer(env.cluster, env.store, stage_a, env.app_a, selector=A_SELECTOR) as a,
        pytest.raises(PollError) as raised,
    ):
        a.poll()
    errors = [f.error for f in raised.value.failures]
    assert errors and all(isinstance(e, MapperError) and "publish=" in str(e) for e in errors)
    assert StateStore(env.cluster, env.app_a).load_journal("in/0").offset == 0  # nothing checkpointed


class CountingAppends:
    """A journal store that counts ``append_many`` calls (the messages of a transaction)."""

    def __init__(self, store: Any) -> None:
        self.store, self.calls = store, 0

    def append_many(self, journal: str, items: Any) -> Any:
        self.calls += 1
        return self.store.append_many(journal, items)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_a_long_transaction_appends_its_messages_in_chunks(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(txn, "QUEUED", 4)
    docs = events(0, 40)
    feed(env.store, docs)
    counting = CountingAppends(env.store)
    with env.a(store=counting) as a:
        assert a.poll().published == 40
    assert counting.calls >= 40 // 4  # appended while the transactions ran (20 messages each), not at the end
    env.b().poll()
    assert board(env.cluster) == model(docs)


def test_a_claim_that_used_its_last_save_number_is_made_anew(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # A long-lived consumer saves without end: past a claim's last save number it claims again (a new
    # generation and producer), never stops; here a claim has 3 save numbers (0: the claim, 1 and 2: saves).
    monkeypatch.setattr(txn, "SAVES", 3)
    docs: list[dict[str, Any]] = []
    with env.a() as a:
        for _ in range(5):
            more = events(len(docs), 6)
            docs += more
            feed(env.store, more, journals=["in/0"])
            assert a.poll().published == 6
            held = TxnStore(StateStore(env.cluster, env.app_a)).load("in/0")
            assert held.seq <= 2
        assert held.gen == 3  # saves 1, 2 | 1, 2 | 1: five polls, three claims
    env.b().poll()
    assert board(env.cluster) == model(docs)  # every event once, through every renewed claim


@pytest.mark.parametrize("journals", ["file", "stream"])
def test_the_shard_holding_the_state_sigkilled_between_and_inside_transactions(
    journals: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one redis-server holding A's checkpoints, counts and B's board (and, with Redis Streams journals,
    the journals) is SIGKILLed twice and started again from its AOF (fsync always: what a reply confirmed is
    on disk): between two polls of A, then inside A's transaction (its mapper kills it at an event, after
    earlier events' messages were published uncommitted). Each poll while it is down fails naming the server
    (a `PollError`; with the journals on that server too, the journal listing's redis-py `ConnectionError`,
    as `RedisJournals` documents); the same `Consumer`'s next poll claims the journals again (re-appending
    the last checkpoint's intents: the abandoned attempt is rolled back) and goes on: each input once."""
    monkeypatch.setattr(txn, "QUEUED", 4)  # a transaction appends its messages as it goes, before the kill
    with LocalShards(1, aof=True, extra=AOF_ALWAYS) as shards:
        url, store = chain_journals(journals, tmp_path, shards)
        env = Env(url, store, shards)
        port = str(shards.servers[0].port)
        trigger, killed = 52, threading.Event()

        def killing(message: Any) -> list[Any]:
            if message.doc["id"] == trigger and not killed.is_set():
                killed.set()
                shards.kill(0)
            return stage_a(message)

        docs = events(0, 20)
        feed(env.store, docs)
        try:
            with env.a(mapper=killing) as a:
                assert a.poll().published == 20
                held = TxnStore(StateStore(env.cluster, env.app_a)).load("in/0")
                more = events(20, 20)
                feed(env.store, more)
                shards.kill(0)  # between two polls
                if journals == "file":
                    with pytest.raises(PollError) as down:
                        a.poll()
                    assert down.value.failures and all(port in str(f.error) for f in down.value.failures)
                else:  # listing the journals fails first: RedisJournals raises redis-py's errors (documented)
                    with pytest.raises(redis.ConnectionError, match=port):
                        a.poll()
                shards.start(0)
                assert TxnStore(StateStore(env.cluster, env.app_a)).load("in/0") == held  # loaded from the AOF
                assert a.poll().published == 20
                held = TxnStore(StateStore(env.cluster, env.app_a)).load("in/0")
                last = events(40, 20)
                feed(env.store, last)
                with pytest.raises(PollError) as inside:  # the mapper kills the server at event 52
                    a.poll()
                assert killed.is_set() and all(port in str(f.error) for f in inside.value.failures)
                shards.start(0)
                assert TxnStore(StateStore(env.cluster, env.app_a)).load("in/0") == held
                # The abandoned attempt's messages are in the journals, uncommitted.
                uncommitted = sum(len(env.read(j, committed=False)) for j in OUTPUTS)
                assert uncommitted > sum(len(env.read(j, committed=True)) for j in OUTPUTS)
                assert a.poll().published >= 20  # the transactions the kill abandoned, again
            env.b().poll()
            assert board(env.cluster) == model(docs + more + last)
            derived = sorted(e.message.doc["src"] for j in OUTPUTS for e in env.read(j, committed=True))
            assert derived == list(range(60))
        finally:
            env.cluster.close()
            store.close()
