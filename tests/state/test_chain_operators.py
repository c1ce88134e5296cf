"""An operator's restart and skip of a publishing application's journal (:meth:`StateStore.restart_journal`,
:meth:`StateStore.skip_lost`, ``zcluster consumers APP skip-lost``), on real redis-server processes with file
journals and Redis Streams journals: the action is a claim (a process still holding an older claim is fenced
on its next save, its messages never commit), the last checkpoint's ACK intents are delivered first (a process
paused between its save and its ACK appends shows the operator's append is what commits them), the audit log
records it and the next poll starts where the action left the checkpoint.

Stage A and B are tests/state/chain_helpers.py's; ``feed`` alternates events between in/0 (even ids) and in/1.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from chain_helpers import A_SELECTOR, INPUTS, OUTPUTS, board, create, events, feed, model, stage_a
from click.testing import CliRunner
from test_chains import Env, chain_journals

from zcluster import FencedError, PollError
from zcluster.cli import cli
from zcluster.journal import FileJournals
from zcluster.journal._filefmt import find_fragment
from zcluster.message import OffsetOutOfRangeError
from zcluster.state import Consumer, StateStore
from zcluster.state.txn import TxnStore
from zcluster.testing import LocalShards


class PausedAcks:
    """A journal store whose first ``append`` (an ACK intent; messages go through ``append_many``) waits for
    ``release``: the process is paused with its checkpoint saved and its ACK intents not appended."""

    def __init__(self, store: Any) -> None:
        self.store, self.armed = store, True
        self.entered, self.release = threading.Event(), threading.Event()

    def append(self, journal: str, data: bytes) -> Any:
        if self.armed:
            self.armed = False
            self.entered.set()
            assert self.release.wait(120)
        return self.store.append(journal, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


class Background:
    """Calls run in threads, each paused on an event; :meth:`finish` releases and joins them (also at the
    teardown of a test that failed first, so that no thread is left waiting)."""

    def __init__(self) -> None:
        self.running: list[tuple[threading.Thread, threading.Event]] = []

    def start(self, call: Callable[[], Any], release: threading.Event) -> list[BaseException]:
        failures: list[BaseException] = []

        def run() -> None:
            try:
                call()
            except BaseException as exc:
                failures.append(exc)

        t = threading.Thread(target=run)
        t.start()
        self.running.append((t, release))
        return failures

    def finish(self) -> None:
        for t, release in self.running:
            release.set()
            t.join(120)
        self.running = []


@pytest.fixture
def background() -> Iterator[Background]:
    runs = Background()
    yield runs
    runs.finish()


def derived(env: Env, committed: bool = True) -> list[int]:
    """The source event ids of the messages in the output journals (read-committed, or all appended)."""
    return sorted(e.message.doc["src"] for j in OUTPUTS for e in env.read(j, committed=committed))


def ids(docs: list[dict[str, Any]], journal: str = "in/0") -> list[int]:
    return [d["id"] for d in docs if INPUTS[d["id"] % 2] == journal]


def test_an_operator_restart_of_a_publishing_journal(env: Env, background: Background) -> None:
    docs = events(0, 10)
    feed(env.store, docs)
    paused = PausedAcks(env.store)
    a = env.a(store=paused)
    failures = background.start(a.poll, paused.release)
    assert paused.entered.wait(120)  # in/0's transaction is saved; its ACK intents are not appended
    state = StateStore(env.cluster, env.app_a)
    before = TxnStore(state).load("in/0")
    assert before.offset > 0 and before.intents and before.gen == 1
    assert derived(env) == []
    uid = env.store.info("in/0").uid
    restarted = state.restart_journal("in/0", uid, reason="ticket 12", publish=env.store)
    assert (restarted.offset, restarted.base, restarted.journal_id) == (0, before.offset + 1, uid)
    (entry,) = [e for e in state.audit() if e["action"] == "restart"]
    assert (entry["journal"], entry["offset"], entry["journal_id"], entry["reason"]) == (
        "in/0",
        before.offset,
        uid,
        "ticket 12",
    )
    after = TxnStore(state).load("in/0")
    # The intents stay in the moved checkpoint (the next claim appends them again: harmless).
    assert (after.offset, after.base, after.gen, after.states) == (0, before.offset + 1, 2, [])
    assert after.intents == before.intents
    # The operator appended in/0's last intents (the paused process has appended none): committed, once.
    assert derived(env) == ids(docs)
    background.finish()
    assert not failures  # the paused process appends the same intents (no change) and commits in/1
    assert derived(env) == list(range(10))

    # That process still holds its claim of in/0, older than the operator's: its next transaction is fenced.
    more = events(10, 6)
    feed(env.store, more)
    with pytest.raises(PollError) as fenced:
        a.poll()
    assert [(f.journal, type(f.error)) for f in fenced.value.failures] == [("in/0", FencedError)]
    assert set(ids(more)) <= set(derived(env, committed=False))  # its messages are in the journals...
    assert derived(env) == sorted(list(range(10)) + ids(more, "in/1"))  # ...and never commit
    assert TxnStore(state).load("in/0").offset == 0
    a.close()

    # The next poll delivers in/0 from offset 0 again (what a restart is for: a journal created anew).
    with env.a() as fresh:
        stats = fresh.poll()
    assert stats.delivered == len(ids(docs + more)) and stats.published == stats.delivered
    assert derived(env) == sorted(list(range(10)) + ids(more, "in/1") + ids(docs + more))
    env.b().poll()
    assert board(env.cluster) == model(docs + more + [d for d in docs if d["id"] in ids(docs)])  # in/0's first 5 twice


def skipping(env: Env, mapper: Any) -> Consumer:
    """Stage A with fail_on_data_loss=False."""
    store = env.store
    return Consumer(env.cluster, store, mapper, env.app_a, selector=A_SELECTOR, publish=store, fail_on_data_loss=False)


def _fed(store: FileJournals, docs: list[dict[str, Any]]) -> tuple[int, int]:
    """Append ``docs`` to in/0 in one append (one fragment file); their byte range."""
    begin = store.end("in/0")
    feed(store, docs, journals=["in/0"])
    return begin, store.end("in/0")


def test_an_operator_skip_of_a_publishing_journals_lost_ranges(
    tmp_path: Path, shards: LocalShards, background: Background
) -> None:
    """Three lost ranges of in/0: the first skipped by the library while the process that stopped before it is
    paused before its ACK appends; the second by the CLI while a process with fail_on_data_loss=False (skipping it
    by itself) is paused in its transaction past it, then fenced; the third skipped by the applier itself."""
    root = tmp_path / "journals"
    with FileJournals(root, fragment_bytes=1) as writer:
        create(writer)
        docs = events(0, 6)
        feed(writer, docs)
        parts = [events(6 + 3 * k, 3) for k in range(6)]  # lost, kept, lost, kept, lost, kept
        ranges = [_fed(writer, p) for p in parts]
    for begin, end in ranges[0::2]:
        path = root / "in/0" / find_fragment(root / "in/0", begin, end)
        path.write_bytes(path.read_bytes()[:-3])
    store = FileJournals(root, fragment_bytes=1)
    lost = ranges[0::2]
    assert [(r.begin, r.end) for r in store.lost_ranges("in/0")] == lost
    kept = [d for p in parts[1::2] for d in p]
    env = Env(str(root), store, shards)
    state = StateStore(env.cluster, env.app_a)
    try:
        # 1. The library: the process stopped before the first range is paused before its ACK appends.
        paused = PausedAcks(store)
        a = env.a(store=paused)
        failures = background.start(a.poll, paused.release)
        assert paused.entered.wait(120)
        before = TxnStore(state).load("in/0")
        assert (before.offset, before.gen) == (lost[0][0], 1) and before.intents and derived(env) == []
        moved = state.skip_lost(store, "in/0", *lost[0], reason="disk, ticket 7", publish=store)
        assert (moved.offset, moved.states) == (lost[0][1], before.states)
        after = TxnStore(state).load("in/0")
        assert (after.offset, after.gen, after.states, after.intents) == (lost[0][1], 2, before.states, before.intents)
        assert derived(env) == ids(docs)  # delivered by the operator's append
        background.finish()
        assert isinstance(failures[0], PollError)
        assert [(f.journal, type(f.error)) for f in failures[0].failures] == [("in/0", OffsetOutOfRangeError)]
        a.close()
        assert derived(env) == list(range(6))

        # 2. The CLI, while a process with fail_on_data_loss=False is inside its transaction past the range.
        with env.a() as a, pytest.raises(PollError):
            a.poll()  # delivers the kept part, stops before the second range
        held = TxnStore(state).load("in/0")
        assert held.offset == lost[1][0] and derived(env) == sorted(list(range(6)) + [d["id"] for d in parts[1]])
        entered, release = threading.Event(), threading.Event()

        def slow(message: Any) -> list[Any]:
            if message.doc["id"] == parts[3][1]["id"]:
                entered.set()
                assert release.wait(120)
            return stage_a(message)

        zombie = skipping(env, slow)
        failures = background.start(zombie.poll, release)
        assert entered.wait(120)
        conn = [a for u in shards.urls for a in ("--url", u)]
        args = [*conn, "--prefix", env.prefix, "consumers", env.app_a, "skip-lost", "in/0", "--reason", "ticket 8"]
        done = CliRunner().invoke(cli, [*args, "--journals", str(root), "--json"])
        assert done.exit_code == 0, done.output
        shown = json.loads(done.stdout)
        assert (shown["begin"], shown["end"], shown["from"], shown["offset"]) == (*lost[1], lost[1][0], lost[1][1])
        cli_moved = TxnStore(state).load("in/0")
        # Without a journal store to publish to, the CLI keeps the intents: the next claim appends them.
        assert (cli_moved.offset, cli_moved.intents) == (lost[1][1], held.intents) and cli_moved.gen > held.gen
        background.finish()
        assert isinstance(failures[0], PollError)
        assert [(f.journal, type(f.error)) for f in failures[0].failures] == [("in/0", FencedError)]
        zombie.close()
        assert set([d["id"] for d in parts[3]]) <= set(
            derived(env, committed=False)
        )  # the fenced process's messages...
        assert not set([d["id"] for d in parts[3]]) & set(derived(env))  # ...never commit
        assert TxnStore(state).load("in/0").offset == lost[1][1]

        # 3. The next poll goes on from the second range's end; fail_on_data_loss=False skips the third itself.
        with skipping(env, stage_a) as a:
            stats = a.poll()
        assert (stats.published, stats.lost_skipped) == (len(parts[3]) + len(parts[5]), 1)
        assert TxnStore(state).load("in/0").offset == store.end("in/0")
        assert derived(env) == sorted(d["id"] for d in docs + kept)  # each once
        skips = [(e["begin"], e["end"], e["by"]) for e in state.audit() if e["action"] == "skip"]
        assert (*lost[0], "operator") in skips and (*lost[1], "operator") in skips and (*lost[2], "applier") in skips
        env.b().poll()
        assert board(env.cluster) == model(docs + kept)
    finally:
        env.cluster.close()
        store.close()


def test_a_publishing_consumer_stopped_at_a_lost_range_keeps_its_claim_until_an_operator_moves_it(
    tmp_path: Path, shards: LocalShards
) -> None:
    """Polling again and again at a lost range neither claims anew nor appends the last ACK intents to every
    downstream journal per poll (they grew while it stayed stuck); an operator's skip is noticed on the next
    poll, which claims from the moved checkpoint and goes on."""
    root = tmp_path / "journals"
    with FileJournals(root, fragment_bytes=1) as writer:
        create(writer)
        docs = events(0, 6)
        feed(writer, docs)
        lost_docs, kept = events(6, 3), events(9, 3)
        lost, _ = _fed(writer, lost_docs), _fed(writer, kept)
    path = root / "in/0" / find_fragment(root / "in/0", *lost)
    path.write_bytes(path.read_bytes()[:-3])
    store = FileJournals(root, fragment_bytes=1)
    env = Env(str(root), store, shards)
    state = StateStore(env.cluster, env.app_a)
    try:
        with env.a() as a:
            with pytest.raises(PollError):
                a.poll()
            stopped = TxnStore(state).load("in/0")
            ends = {j: store.end(j) for j in OUTPUTS}
            assert stopped.offset == lost[0] and stopped.intents and derived(env) == list(range(6))
            for _ in range(4):
                with pytest.raises(PollError) as raised:
                    a.poll()
                assert [type(f.error) for f in raised.value.failures] == [OffsetOutOfRangeError]
            assert {j: store.end(j) for j in OUTPUTS} == ends  # nothing appended downstream while stuck
            assert TxnStore(state).load("in/0")[4:7] == stopped[4:7]  # the same claim: (gen, seq, owner)
            moved = state.skip_lost(store, "in/0", *lost, reason="ticket 9")
            assert moved.offset == lost[1]
            stats = a.poll()  # the same process: notices the take-over, claims anew from the moved checkpoint
        assert stats.published == len(kept) and stats.lost_skipped == 0
        after = TxnStore(state).load("in/0")
        assert (after.offset, after.gen) == (store.end("in/0"), stopped.gen + 2)  # the operator's claim, then its
        assert derived(env) == sorted([d["id"] for d in docs + kept])
    finally:
        env.cluster.close()
        store.close()


@pytest.mark.parametrize("publishing", [True, False])
def test_a_journal_failing_before_its_checkpoint_is_known_is_reported_without_an_offset(
    publishing: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The shard holding the checkpoints is down: the claim (publishing) or the load fails, and so does reading
    the checkpoint for the report. The report says so, not ``offset None``."""
    with LocalShards(1) as shards:
        url, store = chain_journals("file", tmp_path, shards)
        env = Env(url, store, shards)
        try:
            feed(store, events(0, 4))
            a = Consumer(
                env.cluster, store, stage_a, env.app_a, selector=A_SELECTOR, publish=store if publishing else None
            )
            a.applier = dataclasses.replace(a.applier, retries=0)
            shards.kill(0)
            with pytest.raises(PollError) as down:
                a.poll()
            assert [(f.journal, f.offset) for f in down.value.failures] == [("in/0", None), ("in/1", None)]
            text = str(down.value)
            assert "None" not in text
            assert "in/0 at its stored checkpoint (its offset could not be read)" in text
            stop = threading.Event()
            caplog.set_level(logging.ERROR, logger="zcluster.state")
            worker = threading.Thread(target=a.run, args=(stop,), kwargs={"interval": 0.05})
            worker.start()
            deadline = time.monotonic() + 120
            while not any("journal in/1 stays" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, "run() logged no failure"
                time.sleep(0.05)
            stop.set()
            worker.join(120)
            (logged,) = {r.getMessage().split(":")[0] for r in caplog.records if "journal in/0 stays" in r.getMessage()}
            assert logged == "journal in/0 stays at its stored checkpoint (its offset could not be read)"
        finally:
            env.cluster.close()
            store.close()
