"""A two-stage chain's end-to-end throughput: exactly-once publishing against an at-least-once writer.

Stage A (a :class:`zcluster.state.Consumer`) reads N events from 4 input journals, counts each per user
(``Count``) and hands one derived message per event to stage B's 4 journals; stage B (a ``Consumer``) reads
them read-committed into a leaderboard (``Incr``). Two ways between the stages, in one run on the same servers
(one local redis-server for the state, file journals), alternating, each from fresh journals and keys:

* ``exactly_once``: A's mapper returns ``Publish(journal, message)`` (``Consumer(..., publish=store)``): each
  journal's poll publishes uncommitted, saves a fenced checkpoint with its ACK intents, appends them;
* ``at_least_once``: the hand-written way: A's mapper stamps each derived message committed (OUTSIDE_TXN, a
  ``Producer``) and queues it, appending a journal's queue every 4,096 messages (``append_many``, as the
  publishing applier does) and the rest after A's poll. A crash before an append loses messages whose inputs
  were checkpointed; a crash after it publishes them twice on the next run.

Reported: events/s end to end (A's poll + B's poll, B's board checked against the model each run), the ratio
exactly_once / at_least_once (goal >= 0.8) with the paired ratio of each repetition, and the added cost per
published message ((t_eo - t_alo) / N). Medians over ``--repeat``, after one uncounted warm-up run of each.
Results: ``results/chain[-quick].json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from zcluster import Cluster, Count, Incr, Publish
from zcluster.journal import FileJournals
from zcluster.message import Flags, JsonMessage, build_uuid, format_uuid
from zcluster.message.framing import CONTENT_TYPE_NDJSON, JsonFraming
from zcluster.message.journals import JournalSpec
from zcluster.message.mapping import fnv1a32
from zcluster.message.producer import Producer
from zcluster.state import Consumer
from zcluster.testing import LocalShards

INPUTS = [f"in/{i}" for i in range(4)]
OUTPUTS = [f"out/{i}" for i in range(4)]
USERS = 1000


def prepare(root: Path, n: int) -> tuple[FileJournals, dict[str, float]]:
    store = FileJournals(root)
    for names, stage in ((INPUTS, "in"), (OUTPUTS, "out")):
        for name in names:
            store.create(JournalSpec(name, {"content-type": CONTENT_TYPE_NDJSON, "stage": stage}))
    producer, model = b"\x09" * 6, {}
    per: dict[str, list[bytes]] = {j: [] for j in INPUTS}
    for i in range(n):
        user, pts = f"u{i % USERS}", 1 + i % 5
        uuid = format_uuid(build_uuid(producer, (1 << 40) + i << 4, Flags.OUTSIDE_TXN))
        per[INPUTS[i % len(INPUTS)]].append((json.dumps({"UUID": uuid, "user": user, "pts": pts}) + "\n").encode())
        model[user] = model.get(user, 0.0) + pts
    for journal, frames in per.items():
        store.append_many(journal, frames)
    return store, model


def target(user: str) -> str:
    return OUTPUTS[fnv1a32(user) % len(OUTPUTS)]


def stage_b(message: Any) -> list[Any]:
    return [Incr("board", message.doc["user"], float(message.doc["pts"]))]


def run_once(kind: str, url: str, n: int, run: int) -> float:
    with tempfile.TemporaryDirectory() as tmp, Cluster.from_urls([url], prefix=f"ch{kind}{run + 1}:") as cluster:
        store, model = prepare(Path(tmp), n)
        queued: dict[str, list[bytes]] = {j: [] for j in OUTPUTS}
        producer, framing = Producer(), JsonFraming()
        producer.update_clock()

        def exactly_once(message: Any) -> list[Any]:
            doc = message.doc
            derived = JsonMessage({"user": doc["user"], "pts": doc["pts"]})
            return [Count("seen", doc["user"], 1), Publish(target(doc["user"]), derived)]

        def at_least_once(message: Any) -> list[Any]:
            doc = message.doc
            derived = JsonMessage({"user": doc["user"], "pts": doc["pts"]})
            journal = target(doc["user"])
            producer.stamp_committed(derived, journal)
            queue = queued[journal]
            queue.append(framing.marshal(derived))
            if len(queue) >= 4096:
                store.append_many(journal, queue)
                queue.clear()
            return [Count("seen", doc["user"], 1)]

        started = time.perf_counter()
        if kind == "exactly_once":
            with Consumer(cluster, store, exactly_once, f"a{kind}{run + 1}", selector="stage=in", publish=store) as a:
                a.poll()
        else:
            with Consumer(cluster, store, at_least_once, f"a{kind}{run + 1}", selector="stage=in") as a:
                a.poll()
            for journal, frames in queued.items():
                store.append_many(journal, frames)
        with Consumer(cluster, store, stage_b, f"b{kind}{run + 1}", selector="stage=out") as b:
            b.poll()
        seconds = time.perf_counter() - started
        board = {str(e.member): e.score for e in cluster.select(["board"], limit=USERS * 2)["board"]}
        if board != model:
            sys.exit(f"{kind}: the board differs from the model")
        store.close()
        return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="20k events, 2 repetitions")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    n, repeat = (20_000, 2) if args.quick else (args.events, args.repeat)
    kinds = ["exactly_once", "at_least_once"]
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    with LocalShards(1) as shards:
        for kind in kinds:  # warm-up, not counted (the first run of a fresh server and process is slower)
            run_once(kind, shards.urls[0], n // 10, -1)
        for r in range(repeat):
            for kind in kinds if r % 2 == 0 else reversed(kinds):
                samples[kind].append(run_once(kind, shards.urls[0], n, r))
                print(f"run {r} {kind}: {n / samples[kind][-1]:,.0f} events/s", flush=True)
    eo, alo = statistics.median(samples["exactly_once"]), statistics.median(samples["at_least_once"])
    result = {
        "events": n,
        "repeat": repeat,
        "seconds": samples,
        "events_per_s": {"exactly_once": n / eo, "at_least_once": n / alo},
        "ratio": alo / eo,
        "paired_ratios": [a / e for a, e in zip(samples["at_least_once"], samples["exactly_once"], strict=True)],
        "added_us_per_message": (eo - alo) / n * 1e6,
    }
    print(
        f"end to end: exactly-once {n / eo:,.0f} events/s, at-least-once {n / alo:,.0f} events/s, "
        f"ratio {alo / eo:.2f} (goal >= 0.8); added cost {(eo - alo) / n * 1e6:.1f} us per published message"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    name = "chain-quick.json" if args.quick else "chain.json"
    (args.out / name).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
