"""A two-stage chain for the tests of exactly-once publishing (:mod:`zcluster.state.txn`).

Stage A reads events ``{"user", "pts"}`` from the input journals, counts them per user in the cluster and
publishes one derived message per event to the output journals (chosen by user). Stage B reads the outputs
read-committed and keeps a leaderboard: ``board`` holds each user's points. The model: every input event's
points, once. Also run as a script by the subprocess tests (see ``main``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterable
from typing import Any

from zcluster import Cluster, Count, Incr, Publish
from zcluster.journal.store import JournalStore
from zcluster.journal.urls import open_store
from zcluster.message import Flags, JsonMessage, build_uuid, format_uuid
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.message.mapping import fnv1a32

INPUTS = ["in/0", "in/1"]
OUTPUTS = ["out/0", "out/1"]
PRODUCER = b"\x07" * 6
A_SELECTOR, B_SELECTOR = "stage=in", "stage=out"
_last = [0]


def _tick() -> int:
    """An increasing clock, also across the processes of one test (wall time in 100 ns units)."""
    _last[0] = max(_last[0] + 1, time.time_ns() // 100)
    return _last[0]


def create(store: JournalStore) -> None:
    """The input journals (label ``stage=in``) and the output journals (``stage=out``)."""
    for names, stage in ((INPUTS, "in"), (OUTPUTS, "out")):
        for name in names:
            store.create(JournalSpec(name, {"content-type": CONTENT_TYPE_NDJSON, "stage": stage}))


def events(first: int, n: int) -> list[dict[str, Any]]:
    """Events ``first .. first + n - 1``: users u0..u6, points 1..5 (deterministic)."""
    return [{"id": i, "user": f"u{i % 7}", "pts": 1 + i % 5} for i in range(first, first + n)]


def feed(store: JournalStore, docs: list[dict[str, Any]], journals: list[str] = INPUTS) -> None:
    """Append each event committed to one of ``journals`` (alternating)."""
    per: dict[str, list[bytes]] = {}
    for k, doc in enumerate(docs):
        uuid = format_uuid(build_uuid(PRODUCER, _tick() << 4, Flags.OUTSIDE_TXN))
        per.setdefault(journals[k % len(journals)], []).append((json.dumps({"UUID": uuid, **doc}) + "\n").encode())
    for journal, frames in per.items():
        store.append_many(journal, frames)


def model(docs: Iterable[dict[str, Any]]) -> dict[str, float]:
    board: dict[str, float] = {}
    for d in docs:
        board[d["user"]] = board.get(d["user"], 0.0) + d["pts"]
    return board


def stage_a(message: Any) -> list[Any]:
    doc = message.doc
    out = OUTPUTS[fnv1a32(doc["user"]) % len(OUTPUTS)]
    derived = JsonMessage({"user": doc["user"], "pts": doc["pts"], "src": doc["id"]})
    return [Count("seen", doc["user"], 1), Publish(out, derived)]


def stage_b(message: Any) -> list[Any]:
    doc = message.doc
    return [Incr("board", doc["user"], float(doc["pts"]))]


def board(cluster: Cluster) -> dict[str, float]:
    return {str(e.member): e.score for e in cluster.select(["board"], limit=1000)["board"]}


def main() -> None:
    """``python chain_helpers.py <cluster urls,> <prefix> <journals url> <app> <die-at> [<more events> <first>]``:
    poll stage A once; with ``more events``, append them and poll again. ``die-at``: where the process kills
    itself with SIGKILL during the last poll: ``acks`` (the checkpoint saved, before its first ACK intent is
    appended), ``save`` (the messages appended, before the checkpoint is saved) or ``none``."""
    from zcluster.state import Consumer, txn

    urls, prefix, journals, app, die_at = sys.argv[1:6]
    more = sys.argv[6:8]

    def arm() -> None:
        if die_at == "acks":
            append = txn.Publishing._append

            def dying_append(self: txn.Publishing, intents: list[Any]) -> None:
                if intents and self.claims:  # a commit's intents (a claim's re-append happens before claims has it)
                    os.kill(os.getpid(), signal.SIGKILL)
                append(self, intents)

            txn.Publishing._append = dying_append  # type: ignore[method-assign]
        elif die_at == "save":

            def dying_save(self: txn.TxnStore, journal: str, saved: Any) -> Any:
                os.kill(os.getpid(), signal.SIGKILL)

            txn.TxnStore.save_journal = dying_save  # type: ignore[method-assign]

    store = open_store(journals)
    with Cluster.from_urls(urls.split(","), prefix=prefix) as cluster:
        consumer = Consumer(cluster, store, stage_a, app, selector=A_SELECTOR, publish=store)
        if not more:
            arm()
        consumer.poll()
        if more:
            feed(store, events(int(more[1]), int(more[0])))
            arm()
            consumer.poll()
    print("survived", flush=True)


if __name__ == "__main__":
    main()
