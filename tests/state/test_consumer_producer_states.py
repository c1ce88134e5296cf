"""What a long-lived consumer keeps per producer it has seen (the soak publishes with fresh producers all
the time): with ``prune_horizon`` the checkpoint (loaded into every poll's Sequencer) holds the producers
of the last horizon only, however many came before, and exactly-once holds; without it, every producer
ever seen stays. Counts, not memory or time. Real Redis servers, file journals."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster
from zcluster.journal.files import FileJournals
from zcluster.state import Consumer, StateStore, applier
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper

ROUNDS = 6
PRODUCERS = 3  # fresh ones each round, as bench/soak.py publishes


def _run(
    shards: Any, tmp_path: Path, prefix: str, prune_horizon: float | None
) -> tuple[list[int], Traffic, dict[str, Any]]:
    """Rounds of fresh producers, a poll after each, ``prune_horizon`` + 0.3 s apart; the largest number
    of producer states any journal's checkpoint held after each poll."""
    store = FileJournals(tmp_path / "journals")
    names = [f"timelines/part-{i:03d}" for i in range(2)]
    create_journals(store, names)
    traffic = Traffic(names)
    held: list[int] = []
    with Cluster.from_urls(shards.urls, prefix=prefix) as cluster:
        app = f"ps-{prefix.rstrip(':')}"  # checkpoints live in their own namespace, not under the prefix
        consumer = Consumer(cluster, store, timeline_mapper, app, prune_horizon=prune_horizon)
        state = StateStore(cluster, app)
        for seed in range(ROUNDS):
            publish(store, traffic, producers=PRODUCERS, messages=30, seed=seed, start_ts=1.7e9 + seed * 1e5)
            consumer.poll()
            held.append(max(len(state.load_journal(n).states) for n in names))
            time.sleep((prune_horizon or 0.0) + 0.3)  # the next round's clocks are past the horizon
        expected = traffic.expected()
        got = {k: [(t.member, t.score) for t in v] for k, v in cluster.select(list(expected), limit=10**6).items()}
        assert all(state.load_journal(n).offset == store.end(n) for n in names)
    store.close()
    print(f"prune_horizon {prune_horizon}: producer states held after each round: {held}")  # shown with -s
    return held, traffic, {"equal": got == expected}


def test_pruned_checkpoints_hold_the_last_producers_only_and_stay_exact(
    shards: Any, tmp_path: Path, prefix: str
) -> None:
    held, traffic, check = _run(shards, tmp_path, prefix, prune_horizon=1.0)
    # A round's producers are pruned once a later round acknowledged past the horizon: at most two
    # rounds' producers (the last one's, and the one before while its clocks are within the horizon).
    assert max(held) <= 2 * PRODUCERS, held
    assert held[-1] <= 2 * PRODUCERS and held[0] >= 1, held
    # Duplicates (re-appended while their producer is active, as retries are) were refused all the same.
    assert traffic.duplicates > 0 and check["equal"]


def test_without_a_horizon_every_producer_seen_stays_and_a_warning_says_so(
    shards: Any, tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(applier, "MANY_PRODUCERS", 2 * PRODUCERS)
    monkeypatch.setattr(applier, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="zcluster.state"):
        held, _, check = _run(shards, tmp_path, prefix, prune_horizon=None)
    assert held == sorted(held) and held[-1] > 2 * PRODUCERS, held  # grows with every round
    assert check["equal"]
    warned = [r.getMessage() for r in caplog.records if "prune_horizon" in r.getMessage()]
    assert len(warned) == 2 and all("producers and grows" in w for w in warned), warned  # once per journal
