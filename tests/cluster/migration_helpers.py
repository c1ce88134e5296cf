"""What the migration tests share (``test_migration.py``, ``test_migration_resume.py``): a long-lived writer
with a model of what it wrote, the mover in its own process (killed by the test, or by itself at a named
point), and reads of the layout markers."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from typing import Any

import redis
from redis.crc import key_slot

from zcluster import Cluster, Incr, PartialReadError, PartialWriteError
from zcluster._topology import jump_hash

WAIT = 300.0  # outer bound of a wait on a state the run must reach: only a broken run reaches it, not a slow one
# The running writer's pause between steps (of 120 writes): a busy client, not one flat out. Flat out, its
# thread took a core from the suite's other workers (test_migration_resume.py: 195 s of CPU, 102-121 s
# paced), and wrote no differently: what a test needs written while the mover works, it waits for with
# ``advance``.
PACE = 0.01


class Writer:
    """A long-lived client writing inserts, deletes and increments until stopped, with a model of what it
    wrote. Every call that fails is sent again, unchanged (idempotent), until it succeeds."""

    def __init__(self, cluster: Cluster, keys: int = 400, seed: int = 7) -> None:
        self.cluster, self.keys = cluster, keys
        self.rng = random.Random(seed)
        self.model: dict[tuple[str, str], tuple[float, bool]] = {}
        self.totals: dict[tuple[str, str], float] = {}
        self.history: list[tuple[int, Incr]] = []
        self.seq = 0
        self.position = 0
        self.retries = 0
        self.reads_back = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(WAIT)

    def advance(self, steps: int) -> None:
        """Wait until the running writer has made ``steps`` more steps (a state, not a time): what it writes
        from now on, it writes after whatever the test did before."""
        goal, deadline = self.seq + 50 * steps, time.monotonic() + WAIT
        while self.seq < goal:
            assert self.error is None, self.error
            assert time.monotonic() < deadline, "the writer stopped writing"
            time.sleep(0.01)

    def _send(self, call: Any) -> Any:
        while True:
            try:
                return call()
            except PartialWriteError:
                self.retries += 1
                time.sleep(0.01)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.step()
                self.stop.wait(PACE)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def step(self) -> None:
        writes = []
        for _ in range(50):
            self.seq += 1
            key, member = f"t:{self.rng.randrange(self.keys)}", f"m{self.rng.randrange(8)}"
            insert = self.rng.random() < 0.8
            writes.append((key, float(self.seq), member, insert))
            if (key, member) not in self.model or self.model[key, member][0] < self.seq:
                self.model[key, member] = (float(self.seq), insert)
        inserts = [(k, s, m) for k, s, m, ins in writes if ins]
        deletes = [(k, s, m) for k, s, m, ins in writes if not ins]
        self._send(lambda: self.cluster.insert(inserts))
        self._send(lambda: self.cluster.delete(deletes))
        items = []
        for _ in range(20):
            self.position += 1
            incr = Incr(f"board:{self.rng.randrange(50)}", f"p{self.rng.randrange(5)}", 1.0)
            items.append((self.position, incr))
            self.totals[incr.key, incr.member] = self.totals.get((incr.key, incr.member), 0.0) + 1.0
        self.history += items
        self._send(lambda: self.cluster.increment("writer", items))
        # A read of what was just written never goes backwards, before, during or after the cut-over.
        key, score, member, insert = writes[-1]
        try:
            got = self.cluster.score([(key, member)])[(key, member)]
        except PartialReadError:  # a shard down (a fault test): nothing to compare this time
            return
        if got.score is None or got.score < score:
            raise AssertionError(f"read went backwards: {key}/{member} {got} after writing {score}")
        self.reads_back += 1

    def check(self, cluster: Cluster) -> None:
        assert self.error is None, self.error
        by_key: dict[str, dict[str, float]] = {}
        for (key, member), (score, insert) in self.model.items():
            by_key.setdefault(key, {})
            if insert:
                by_key[key][member] = score
        got = cluster.select(list(by_key), limit=100)
        for key, members in by_key.items():
            assert {m.member: m.score for m in got[key]} == members, key
        boards = sorted({k for k, _ in self.totals})
        read = cluster.select(boards, limit=100)
        for key in boards:
            expect = {m: t for (k, m), t in self.totals.items() if k == key}
            assert {m.member: m.score for m in read[key]} == expect, key
        again = cluster.increment("writer", self.history[-2000:], raise_on_error=False)
        assert again.applied_count == 0, "a replayed increment applied again"


def fresh_shard(target: list[str], prefix: str, redis_key: bytes) -> int:
    return jump_hash(key_slot(redis_key), len(target))


# ``zcluster migrate`` that SIGKILLs itself at a named point: ``cutting`` (every source marker in its cut-over,
# clients waiting, before the last copy), ``final:N`` (right after the N-th final write to a source marker: the
# target's marker on a shard of both layouts, or ``done``), ``write:N`` (right after the N-th write of any
# marker, CAS or SET), ``copy:N`` (right after the N-th copy of keys, mid-pass), ``clean`` (the cut-over done,
# before the clean-up). ``stop:copy`` and ``stop:cutting`` SIGSTOP it instead (a paused mover: a GC pause, a
# suspended VM), after its first copy of keys or in its cut-over before the last copy; the test continues it
# with SIGCONT.
_KILLING = """
import json, os, signal, sys
from zcluster.migration import mover
point = sys.argv.pop(1)
kind, _, n = point.partition(":")
count = [0]
def die(*_):
    os.kill(os.getpid(), signal.SIGKILL)
def tick():
    count[0] += 1
    if count[0] == int(n):
        die()
cas, set_marker = mover.Migration._cas, mover.Migration._set
def counting_cas(self, shard, old, value):
    cas(self, shard, old, value)
    marker = json.loads(value)
    origin = marker.get("from")  # the target's marker on a shard of both layouts
    final = isinstance(origin, dict) and origin.get("shards") != marker.get("shards")
    if kind == "write" or final or marker.get("move", {}).get("state") == "done":
        tick()
def counting_set(self, shard, value):
    set_marker(self, shard, value)
    tick()
def stop():
    os.kill(os.getpid(), signal.SIGSTOP)
if kind == "stop" and n == "copy":
    copy = mover.Copier.copy
    def stopping_copy(self, i, keys):
        copy(self, i, keys)
        if keys and not count[0]:
            count[0] = 1
            stop()
    mover.Copier.copy = stopping_copy
elif kind == "stop":
    last_copy = mover.Migration._last_copy
    def stopping_last_copy(self, *args):
        stop()
        return last_copy(self, *args)
    mover.Migration._last_copy = stopping_last_copy
elif kind == "copy":
    copy = mover.Copier.copy
    def killing_copy(self, i, keys):
        copy(self, i, keys)
        if keys:
            tick()
    mover.Copier.copy = killing_copy
elif kind == "cutting":
    mover.Migration._last_copy = die
elif kind == "clean":
    mover.Migration._clean_up = die
else:
    mover.Migration._cas = counting_cas
    if kind == "write":
        mover.Migration._set = counting_set
from zcluster.cli import main
main()
"""


def mover(
    source: list[str], target: list[str], prefix: str, *extra: str, kill_at: str | None = None
) -> subprocess.Popen[bytes]:
    """``zcluster migrate`` in its own process (so that a test can SIGKILL it, or it kills itself at
    ``kill_at``: see ``_KILLING``)."""
    args = [sys.executable, *(("-c", _KILLING, kill_at) if kill_at else ("-m", "zcluster.cli")), "--prefix", prefix]
    for url in source:
        args += ["--url", url]
    args += ["migrate", "--namespace", prefix, "--json", *extra]
    for url in target:
        args += ["--to-cluster" if url.startswith("redis+cluster") else "--to", url]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def move_state(url: str, prefix: str) -> str | None:
    with redis.Redis.from_url(url, retry_on_error=[redis.ConnectionError]) as r:  # the cut-over kills it too
        raw = r.get(f"{{{prefix}}}layout")
    marker = json.loads(raw) if raw else {}
    return marker.get("move", {}).get("state")


def marker(url: str, prefix: str) -> dict[str, Any]:
    with redis.Redis.from_url(url) as r:
        raw = r.get(f"{{{prefix}}}layout")
    return json.loads(raw) if raw else {}


def stopped(proc: subprocess.Popen[bytes]) -> None:
    """Wait until ``proc`` has stopped itself (SIGSTOP at a ``stop:`` point): its state in /proc is ``T``."""
    deadline = time.monotonic() + WAIT
    while True:
        assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
        with open(f"/proc/{proc.pid}/stat", "rb") as stat:
            if stat.read().rsplit(b")", 1)[1].split()[0] == b"T":
                return
        assert time.monotonic() < deadline, "the mover never reached its stop point"
        time.sleep(0.01)
