"""The compiled hot path (:mod:`zcluster._native`: the Consumer's per-message modules compiled with mypyc)
against the pure-Python modules, its oracle, on random file journals: committed messages, transactions
committed and rolled back, duplicates, increments, undecodable lines, messages without a UUID, a fragment
damaged on disk (a lost range, skipped), small rings (spans replayed from the journal), small write batches
and checkpoints between polls.

Each path runs in a process of its own (``ZCLUSTER_PURE=1`` for the pure one) against the same journals,
under its own key prefix of the same Redis server; the delivered messages, the batch figures, the
checkpoints and every key's contents must be equal. Skipped when the modules are not compiled here.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from zcluster import _native
from zcluster.journal import FileJournals
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.testing import LocalShards
from zcluster.testing.traffic import Traffic, create_journals, publish

pytestmark = pytest.mark.skipif(
    _native.pure() or not _native.compiled(),
    reason="the hot path is not compiled here (python -m zcluster._native_build build)",
)

NAMES = ["native/a", "native/b", "native/c"]
NOISE = [
    b"not json",
    b'{"UUID": "zz", "user": "u1"}',
    b'{"UUID": "00000000-0000-1000-8000-00000000000g", "user": "u1"}',
    b'{"n": NaN, "UUID": null}',
    b"\xff\xfe",
    b"",
]


def _journals(root: Path, seed: int) -> dict[str, list[int]]:
    """Random traffic with noise in file journals under ``root``, one fragment damaged on disk; per journal,
    the offsets its polls end at (frame boundaries)."""
    rng = random.Random(seed)
    store = FileJournals(root, fragment_bytes=2048)
    create_journals(store, NAMES)
    traffic = Traffic(NAMES)
    for part in range(3):
        publish(store, traffic, producers=3, messages=40, users=15, seed=seed * 10 + part, txn_every=3)
        for name in NAMES:  # lines that do not decode, and messages without a UUID (never sequenced)
            for _ in range(rng.randint(0, 3)):
                store.append(name, rng.choice(NOISE) + b"\n")
            doc = {"user": f"u{rng.randrange(15)}", "event": f"z{part}", "ts": 1.7e9 + rng.random(), "op": "add"}
            store.append(name, json.dumps(doc).encode() + b"\n")
    data = {name: b"".join(chunk for _, chunk in store.read(name, 0))[: store.end(name)] for name in NAMES}
    store.close()
    # A byte flipped in the middle of one journal's fragment files: its records there fail their checksums.
    files = sorted(p for p in (root / NAMES[1]).rglob("*") if p.is_file() and p.stat().st_size > 64)
    victim = files[len(files) // 2]
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0x55
    victim.write_bytes(bytes(raw))
    with FileJournals(root, fragment_bytes=2048) as opened:  # recovered (quarantined) once, before either run
        for name in NAMES:
            opened.end(name)
    cuts = {}
    for name, text in data.items():
        ends = [i + 1 for i, b in enumerate(text) if b == 0x0A]
        cuts[name] = sorted({ends[len(ends) // 3], ends[2 * len(ends) // 3], len(text)})
    return cuts


def _worker(job: dict[str, Any]) -> dict[str, Any]:
    """One path's run (in its own process): apply each journal in polls ending at its cuts."""
    from zcluster import Cluster
    from zcluster.state import Applier, BatchStats, StateStore
    from zcluster.testing.traffic import leaderboard_mapper

    delivered: list[Any] = []

    def mapper(message: Any) -> Any:
        delivered.append(message.doc)
        return leaderboard_mapper(message) if "op" in message.doc else []

    store = FileJournals(job["root"], fragment_bytes=2048)
    with Cluster.from_urls([job["url"]], prefix=job["prefix"]) as cluster:
        applier = Applier(cluster, job["app"], mapper, journals=store, ring=4, flush=7, fail_on_data_loss=False)
        stats = BatchStats()
        for name, cuts in job["cuts"].items():
            begin = 0
            for cut in cuts:
                applier.apply_range(store, name, CONTENT_TYPE_NDJSON, begin, cut, stats)
                begin = cut
        checkpoints = {}
        for name in job["cuts"]:
            cp = StateStore(cluster, job["app"]).load_journal(name)
            checkpoints[name] = [cp.offset, sorted([list(s[:2]), *s[2:]] for s in cp.states)]
    store.close()
    counters = stats.counters()
    return {
        "compiled": _native.compiled(),
        "delivered": delivered,
        "counters": counters,
        "checkpoints": json.loads(json.dumps(checkpoints, default=lambda b: b.hex())),
    }


def _run(job: dict[str, Any], pure: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "ZCLUSTER_PURE"}
    if pure:
        env["ZCLUSTER_PURE"] = "1"
    done = subprocess.run(
        [sys.executable, __file__, json.dumps(job)], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def _contents(url: str, prefix: str, app: str) -> dict[str, Any]:
    """Every key under ``prefix`` but the layout's record (its own id and time) and its contents, by type, shown
    with the prefix cut off and ``app`` (which names increments' fences) as APP."""
    client = redis.Redis.from_url(url)
    out: dict[str, Any] = {}
    for key in client.scan_iter(match="{" + prefix + "*", count=1000):  # {P K}+ and the like (zcluster._keys)
        name = key.decode(errors="surrogateescape")[len(prefix) + 1 :]
        if name == "}layout":
            continue
        kind = client.type(key).decode()
        if kind == "zset":
            value: Any = client.zrange(key, 0, -1, withscores=True)
        elif kind == "hash":
            value = sorted(client.hgetall(key).items())
        elif kind == "set":
            value = sorted(client.smembers(key))
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        else:
            value = client.get(key)
        out[name.replace(app, "APP")] = (kind, repr(value).replace(app, "APP"))
    client.close()
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_compiled_path_applies_as_the_pure_one(tmp_path: Path, shards: LocalShards, seed: int) -> None:
    root = tmp_path / "journals"
    cuts = _journals(root, seed)
    tag = uuid.uuid4().hex[:8]
    job = {"root": str(root), "url": shards.urls[0], "cuts": cuts}
    # Apart: a checkpoint is stored under its application's name (not the cluster's prefix).
    pure = _run({**job, "prefix": f"pure{tag}:", "app": f"pure{tag}"}, pure=True)
    native = _run({**job, "prefix": f"native{tag}:", "app": f"native{tag}"}, pure=False)
    assert pure["compiled"] == [] and native["compiled"] == list(_native.MODULES + _native.EXTENSIONS)
    assert pure["counters"]["lost_skipped"] == 1  # the damaged fragment was met, and skipped, by both
    assert pure["counters"]["malformed"] > 0 and pure["counters"]["rollbacks"] > 0
    assert pure["counters"]["duplicates"] > 0 and pure["counters"]["replays"] > 0
    for field in ("delivered", "counters", "checkpoints"):
        assert native[field] == pure[field], field
    pure_keys = _contents(shards.urls[0], f"pure{tag}:", f"pure{tag}")
    native_keys = _contents(shards.urls[0], f"native{tag}:", f"native{tag}")
    assert pure_keys and native_keys == pure_keys


if __name__ == "__main__":  # a worker: one path's run, its result as the last line of stdout
    print(json.dumps(_worker(json.loads(sys.argv[1]))))
