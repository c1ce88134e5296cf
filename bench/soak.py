"""A week in a minute: the exactly-once pipeline under faults, for a configurable time.

Producers keep publishing synthetic timeline traffic (:func:`zcluster.testing.traffic.publish`, in rounds
of fresh producers: committed messages, transactions, rollbacks, duplicated appends) into 4 file journals,
while one worker *process* runs three plain exactly-once consumers (:class:`zcluster.state.Consumer`, one
thread each, application ``soak``) from those journals into three stores at once:

  shards   2 standalone shards with the AOF on, ``appendfsync always``: with ``everysec`` Redis may hold
           an AOF write back up to 2 s while an fsync is slow (acknowledged writes a SIGKILL then loses),
           and Redis 7.0 has no WAITAOF for ``Durability(local_aof=True)`` to wait for it;
  cluster  a Redis Cluster of 3 masters with a replica each (``Durability(replicas=1)``), one long-lived
           client following its failovers;
  farm     a farm of 3 replicas of one standalone server each (write quorum 2).

Faults are injected on a schedule (``--fault-every`` seconds apart; default a sixth of ``--seconds``, at
most 15 s), one at a time, in cycles of these kinds (``--kinds`` picks some):

  worker-kill       the worker process is SIGKILLed 50 ms after a burst of 10 publish rounds (while it
                    consumes them: the JSON says how far behind each store's checkpoints were) and
                    started again; only in the first ``--worker-kills`` cycles (default 1), so that the
                    last worker process lives through every later fault and its RSS says something;
  journal-damage    the worker is frozen (SIGSTOP), a fragment of messages it has not read is appended,
                    sealed and damaged on disk (cut short: a lost range), the worker continues (SIGCONT),
                    each consumer stops at the range (its polls fail there, everything before it applied)
                    and an operator skips it on every store (``StateStore.skip_lost``, audited);
  shard-restart     one AOF shard is SIGKILLed and, ``--down`` seconds later, started again (its data
                    comes back from the AOF);
  cluster-failover  a master of the Redis Cluster is SIGKILLed; once its replica took over, the killed
                    node is started again (it rejoins as a replica);
  farm-rebuild      one replica of the farm is SIGKILLed, started again empty ``--down`` seconds later,
                    and rebuilt by the walker (checkpoints and data) while the consumer writes on.

After each fault the soak waits until every store's checkpoints reached the journals' ends as they were
when the fault was over: its recovery time, from the fault. At the end, the publisher stops, the consumers
drain, and every store must equal the traffic's model (:meth:`Traffic.expected`), each farm replica too:
the messages of the skipped lost ranges are ones no model counts (a producer of their own published them,
alone in their fragment), so the model is exact, and none of them may be found in a store. The worker's
RSS (``/proc/<pid>/status``) is sampled every second, with its glibc heap (in use, free but kept); each
worker process's RSS after ``--warmup`` seconds and at its end, and the longest-lived one's slope, are
reported. ``--malloc-arena-max N`` runs the worker with ``MALLOC_ARENA_MAX=N`` (glibc's default lets each
thread have an arena of its own, each keeping its own peak; it did not change the creep: ``docs/faults.md``,
"Long runs"). ``--tracemalloc`` shows what Python allocations grew. Everything runs on loopback, every wait has a
timeout, and every process started is stopped on the way out (the worker and the servers also die with
this process).

    python bench/soak.py                      # 60 s of traffic and faults (~70 s in all)
    python bench/soak.py --seconds 3600       # an hour: a fault every 15 s, ~240 of them
    python bench/soak.py --seconds 40 --out /tmp/soak   # what tests/test_soak.py runs

Results: ``bench/results/soak.json`` (other durations: ``soak-<seconds>s.json``; ``--out DIR``). Exit
status 1 if a store differs from the model, a fault did not recover in time, or a check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as dt
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from zcluster import Cluster, Durability, KeyMember, PollError
from zcluster.farm import Farm, FarmConfig, Walker
from zcluster.journal import FileJournals
from zcluster.journal._filefmt import find_fragment
from zcluster.journal.publishing import AsyncPublisher
from zcluster.message import OffsetOutOfRangeError
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.message.mapping import modulo_mapping
from zcluster.message.records import JsonMessage
from zcluster.state import Consumer, StateStore
from zcluster.testing import LocalRedisCluster, LocalServer, LocalShards, server_version
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper
from zcluster.types import Store

RESULTS = Path(__file__).resolve().parent / "results"
APP = "soak"
PREFIX = "soak:"
JOURNALS = [f"timelines/part-{i:03d}" for i in range(4)]
KINDS = ("worker-kill", "journal-damage", "shard-restart", "cluster-failover", "farm-rebuild")
STORES = ("shards", "cluster", "farm")
FAST = "socket_connect_timeout=1&socket_timeout=10"

log = logging.getLogger("soak")


# -- the stores, as the worker and the orchestrator both open them -------------------------------------------


def open_stores(where: dict[str, Any]) -> dict[str, Store]:
    """The three stores of ``where`` (``shards``: URLs, ``cluster``: a seed URL, ``farm``: URLs)."""
    connection = {"socket_connect_timeout": 1.0, "socket_timeout": 10.0}
    return {
        "shards": Cluster.from_urls(where["shards"], prefix=PREFIX, connection=connection),
        # Effects and checkpoints on a replica before a call returns: a failover loses neither.
        "cluster": Cluster.from_cluster_url(
            where["cluster"], prefix=PREFIX, durability=Durability(replicas=1, timeout=2.0)
        ),
        "farm": FarmConfig.of([f"{u}?{FAST}" for u in where["farm"]], prefix=PREFIX).open(),
    }


def close_stores(stores: dict[str, Store]) -> None:
    for store in stores.values():
        with contextlib.suppress(Exception):
            store.close()  # type: ignore[attr-defined]


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def malloc_kb() -> tuple[int, int] | None:
    """glibc's heap of this process in kB: (in use, free but kept), from ``mallinfo2`` (None elsewhere).
    What tells a leak (in use grows) from memory the allocator keeps after a peak (free grows)."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _Mallinfo2
    m = fn()
    return (m.uordblks + m.hblkhd) // 1024, m.fordblks // 1024


def rss_kb(pid: int) -> int | None:
    """VmRSS of process ``pid`` in kB (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


# -- the worker process: three consumers, one thread each ----------------------------------------------------


def worker(config_path: str) -> int:
    """Consume the journals into the three stores until SIGTERM (or the parent dies); status to a file."""
    cfg = json.loads(Path(config_path).read_text())
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(threadName)s %(name)s: %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    parent = os.getppid()
    journals = FileJournals(cfg["journals"])
    stores = open_stores(cfg["where"])
    status: dict[str, Any] = {"pid": os.getpid(), "ready": False, "apps": {}}
    lock = threading.Lock()

    def write_status() -> None:
        with lock:
            tmp = Path(f"{cfg['status']}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(status))
            tmp.replace(cfg["status"])

    def loop(name: str, consumer: Consumer) -> None:
        mine = status["apps"][name]
        while not stop.is_set():  # what Consumer.run does, counting what each poll did
            failed = False
            try:
                stats = consumer.poll()
            except PollError as exc:
                stats, failed = exc.stats, True
                with lock:
                    mine["failed_polls"] += 1
                    mine["last_error"] = "; ".join(f"{f.journal}: {type(f.error).__name__}" for f in exc.failures)
                    for f in exc.failures:  # a lost range stops its journal on every poll until it is skipped
                        if isinstance(f.error, OffsetOutOfRangeError) and f.error.lost_begin is not None:
                            where = f"{f.journal}@{f.error.lost_begin}"
                            mine["lost_stops"][where] = mine["lost_stops"].get(where, 0) + 1
            except Exception as exc:  # listing the journals failed: report, wait, go on
                with lock:
                    mine["failed_polls"] += 1
                    mine["last_error"] = f"{type(exc).__name__}: {exc}"[:300]
                stop.wait(0.5)
                continue
            with lock:
                mine["polls"] += 1
                mine["frames"] += stats.frames
                mine["delivered"] += stats.delivered
                mine["duplicates"] += stats.duplicates
                mine["rollbacks"] += stats.rollbacks
            if stats.delivered:
                write_status()  # what a SIGKILL would otherwise lose of the counts
            if stats.frames == 0 or failed:  # as Consumer.run: wait after a poll that found nothing or failed
                stop.wait(cfg["interval"])

    consumers = {
        name: Consumer(
            store, journals, timeline_mapper, APP, retries=12, prune_horizon=cfg["prune_horizon"], flush=4096
        )
        for name, store in stores.items()
    }
    for name in consumers:
        status["apps"][name] = dict.fromkeys(("polls", "failed_polls", "frames", "delivered", "duplicates"), 0)
        status["apps"][name].update(rollbacks=0, last_error=None, lost_stops={})
    threads = [threading.Thread(target=loop, args=(n, c), name=n, daemon=True) for n, c in consumers.items()]
    if cfg.get("tracemalloc"):
        threads.append(threading.Thread(target=trace_memory, args=(cfg, stop), name="tracemalloc", daemon=True))
    for t in threads:
        t.start()
    status["ready"] = True
    try:
        while not stop.is_set():
            status["malloc_kb"] = malloc_kb()
            write_status()
            if os.getppid() != parent:  # the orchestrator is gone: stop by ourselves
                stop.set()
            stop.wait(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        status["stopped"] = True
        write_status()
        close_stores(stores)
        journals.close()
    return 0


def trace_memory(cfg: dict[str, Any], stop: threading.Event) -> None:
    """``--tracemalloc``: after the warm-up, a baseline snapshot; then every ``tracemalloc`` seconds (and at
    the end) the allocations grown since the baseline, by file:line, and the object counts grown, by type,
    appended to ``<status>.tracemalloc.txt``: what holds the memory an RSS series only shows growing."""
    import gc
    import tracemalloc
    from collections import Counter

    tracemalloc.start(8)
    if stop.wait(cfg["warmup"]):
        return
    import linecache

    # Not the tracer's own: its snapshots and the source lines its tracebacks show.
    filters = [tracemalloc.Filter(False, m.__file__) for m in (tracemalloc, linecache)]
    filters.append(tracemalloc.Filter(False, "<frozen *>"))
    base = tracemalloc.take_snapshot().filter_traces(filters)
    types = Counter(type(o).__name__ for o in gc.get_objects())
    started = time.monotonic()
    out = Path(f"{cfg['status']}.tracemalloc.txt")
    while True:
        done = stop.wait(cfg["tracemalloc"])
        snap = tracemalloc.take_snapshot().filter_traces(filters)
        grown = Counter(type(o).__name__ for o in gc.get_objects())
        grown.subtract(types)
        diff = snap.compare_to(base, "lineno")
        lines = [f"== {time.monotonic() - started:.0f} s after the baseline; traced {tracemalloc.get_traced_memory()}"]
        lines += [str(d) for d in diff[:25]]
        lines.append("-- object counts grown, by type")
        lines += [f"{n:+8d} {t}" for t, n in grown.most_common(15)]
        lines.append("-- top 3 growths, by traceback")
        for d in snap.compare_to(base, "traceback")[:3]:
            lines.append(f"{d.size_diff / 1024:+.1f} KiB, {d.count_diff:+d} blocks")
            lines += [f"    {frame}" for frame in d.traceback.format()[-16:]]
        with out.open("a") as f:
            f.write("\n".join(lines) + "\n\n")
        if done:
            return


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):  # Linux: SIGKILL when the orchestrator dies, even by SIGKILL
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


# -- the orchestrator --------------------------------------------------------------------------------------


def wait_for(what: str, check: Callable[[], bool], timeout: float, every: float = 0.1) -> float:
    """Seconds until ``check()`` held (exceptions count as not yet); TimeoutError after ``timeout``."""
    started = time.monotonic()
    while True:
        with contextlib.suppress(Exception):
            if check():
                return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what}: not after {timeout:.0f} s")
        time.sleep(every)


def cluster_nodes(nodes: list[LocalServer]) -> list[list[str]]:
    """``CLUSTER NODES`` rows of the first live node."""
    for node in nodes:
        if node.process is None:
            continue
        with contextlib.suppress(Exception), node.client(socket_timeout=2) as c:
            return [r.split() for r in c.execute_command("CLUSTER", "NODES").decode().splitlines() if r.strip()]
    raise RuntimeError("no live node of the Redis Cluster answers")


def node_port(row: list[str]) -> int:
    return int(row[1].split("@")[0].rsplit(":", 1)[1])


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.started = time.monotonic()
        self.traffic = Traffic(JOURNALS)
        self.round_lock = threading.Lock()
        self.stop_publishing = threading.Event()
        self.publish_error: BaseException | None = None
        self.rounds = 0
        self.faults: list[dict[str, Any]] = []
        self.lost: list[dict[str, Any]] = []
        self.incarnations: list[dict[str, Any]] = []
        self.samples: list[tuple[float, int, int]] = []  # (t, pid, rss kB)
        self.heap: dict[float, tuple[int, int]] = {}  # t of a sample -> the worker's malloc (in use, free) kB
        self.sampling = threading.Event()
        self.worker: subprocess.Popen[bytes] | None = None
        self.counts = dict.fromkeys(KINDS, 0)

    def now(self) -> float:
        return round(time.monotonic() - self.started, 2)

    # -- traffic -------------------------------------------------------------------------------------------

    def publisher(self) -> None:
        """Rounds of :func:`publish` (3 fresh producers each) at about ``--rate`` committed messages/s."""
        try:
            begun = time.monotonic()
            while not self.stop_publishing.is_set():
                self.publish_round()
                ahead = self.traffic.committed / self.args.rate - (time.monotonic() - begun)
                if ahead > 0:
                    self.stop_publishing.wait(ahead)
        except BaseException as exc:
            self.publish_error = exc
            log.exception("publisher failed")

    def publish_round(self) -> None:
        with self.round_lock:
            publish(
                self.journals,
                self.traffic,
                producers=3,
                messages=self.args.round_steps,
                users=self.args.users,
                seed=self.rounds,
                start_ts=1_700_000_000.0 + self.rounds * 100_000,
            )
            self.rounds += 1

    # -- the worker ----------------------------------------------------------------------------------------

    def start_worker(self) -> None:
        n = len(self.incarnations)
        status = self.work / f"status-{n}.json"
        config = self.work / "worker.json"
        config.write_text(
            json.dumps(
                {
                    "journals": str(self.journals.root),
                    "where": self.where,
                    "status": str(status),
                    "interval": 0.1,
                    "prune_horizon": 30.0,
                    "tracemalloc": self.args.tracemalloc,
                    "warmup": self.args.warmup,
                }
            )
        )
        logfile = open(self.work / f"worker-{n}.log", "wb")  # noqa: SIM115 (closed with the process)
        started = time.monotonic()
        self.worker = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            env=self.worker_env(),
        )
        logfile.close()
        info: dict[str, Any] = {"pid": self.worker.pid, "started": self.now(), "status": str(status)}
        self.incarnations.append(info)
        wait_for("the worker to start", lambda: self.status(info).get("ready", False), 60.0)
        info["ready_after"] = round(time.monotonic() - started, 2)

    def worker_env(self) -> dict[str, str]:
        """The worker's environment: ours, with ``MALLOC_ARENA_MAX`` from ``--malloc-arena-max`` (see there)."""
        env = dict(os.environ)
        if self.args.malloc_arena_max > 0:
            env["MALLOC_ARENA_MAX"] = str(self.args.malloc_arena_max)
        return env

    def status(self, info: dict[str, Any]) -> dict[str, Any]:
        try:
            doc: dict[str, Any] = json.loads(Path(info["status"]).read_text())
            return doc
        except (OSError, ValueError):
            return {}

    def end_worker(self, how: str) -> None:
        proc, info = self.worker, self.incarnations[-1]
        assert proc is not None
        if how == "killed":
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            how += " (SIGKILL after 60 s)"
        info.update(ended=self.now(), how=how, apps=self.status(info).get("apps", {}))
        self.worker = None

    def sampler(self) -> None:
        while not self.sampling.wait(1.0):
            proc = self.worker
            if proc is not None:
                kb = rss_kb(proc.pid)
                if kb is not None:
                    self.samples.append((t := self.now(), proc.pid, kb))
                    heap = self.status(self.incarnations[-1]).get("malloc_kb")
                    if heap:
                        self.heap[t] = (heap[0], heap[1])

    # -- progress ------------------------------------------------------------------------------------------

    def offsets(self) -> dict[str, dict[str, int]]:
        return {
            name: {j: StateStore(store, APP).load_journal(j).offset for j in JOURNALS}
            for name, store in self.stores.items()
        }

    def caught_up(self, ends: dict[str, int]) -> bool:
        return all(held[j] >= ends[j] for held in self.offsets().values() for j in JOURNALS)

    def ends(self) -> dict[str, int]:
        return {j: self.journals.end(j) for j in JOURNALS}

    # -- faults --------------------------------------------------------------------------------------------

    def inject(self, kind: str) -> dict[str, Any]:
        n = self.counts[kind]
        self.counts[kind] += 1
        fault: dict[str, Any] = {"kind": kind, "at": self.now()}
        t0 = time.monotonic()
        print(f"[{fault['at']:7.1f}s] {kind} #{n + 1} ...", flush=True)
        try:
            fault.update(getattr(self, kind.replace("-", "_"))(n))
            fault["action_seconds"] = round(time.monotonic() - t0, 2)
            ends = self.ends()
            wait_for(f"{kind}: consumers catching up", lambda: self.caught_up(ends), self.args.recovery_timeout, 0.2)
            fault["recovered_after"] = round(time.monotonic() - t0, 2)
            fault["ok"] = True
        except Exception as exc:
            fault.update(ok=False, error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc(limit=4))
        summary = ", ".join(f"{k} {v}" for k, v in fault.items() if k not in ("kind", "at", "trace", "walks"))
        print(f"[{self.now():7.1f}s] {kind} #{n + 1}: {summary}", flush=True)
        self.faults.append(fault)
        return fault

    def worker_kill(self, n: int) -> dict[str, Any]:
        pid = self.worker.pid if self.worker else None
        for _ in range(10):  # a burst, so that the kill lands while it consumes
            self.publish_round()
        time.sleep(0.05)
        ends = self.ends()
        self.end_worker("killed")
        behind = {name: sum(ends[j] - held[j] for j in JOURNALS) for name, held in self.offsets().items()}
        self.start_worker()
        return {"killed_pid": pid, "new_pid": self.incarnations[-1]["pid"], "bytes_behind_at_kill": behind}

    def journal_damage(self, n: int) -> dict[str, Any]:
        journal = JOURNALS[n % len(JOURNALS)]
        store = self.journals
        proc = self.worker
        assert proc is not None
        events = [
            {"user": f"u{(n * 7 + i) % self.args.users}", "event": f"lost{n}-{i}", "ts": 1.8e9 + i, "op": "add"}
            for i in range(self.args.lost_messages)
        ]
        with self.round_lock:  # no traffic frame lands among them
            proc.send_signal(signal.SIGSTOP)  # the worker reads nothing appended from now on
            frozen = time.monotonic()
            try:
                store.roll(journal)
                begin = store.end(journal)
                spec = JournalSpec(journal, {"content-type": CONTENT_TYPE_NDJSON})
                mapping = modulo_mapping(lambda m: m.doc["user"], lambda: [spec])
                pub = AsyncPublisher(store)  # a producer of its own: its messages are in no model
                try:
                    for doc in events:
                        pub.publish_committed(mapping, JsonMessage(dict(doc)))
                finally:
                    pub.close()
                end = store.end(journal)
                written = b"".join(chunk for _, chunk in store.read(journal, begin))
                lines = [json.loads(x) for x in written.splitlines()]
                assert [d["event"] for d in lines] == [d["event"] for d in events], "the fragment holds others"
                assert store.roll(journal), "nothing to seal"
                where = store.root.joinpath(*journal.split("/"))
                path = where / find_fragment(where, begin, end)
                path.write_bytes(path.read_bytes()[:-3])  # the disk cut it short
                store.recover(journal)
                assert (begin, end) in [(r.begin, r.end) for r in store.lost_ranges(journal)]
            finally:
                proc.send_signal(signal.SIGCONT)
            frozen_for = time.monotonic() - frozen
        where = f"{journal}@{begin}"

        def stopped_there() -> bool:  # each consumer reported the range (its poll failed there) and sits at it
            apps = self.status(self.incarnations[-1]).get("apps", {})
            reported = all(apps.get(name, {}).get("lost_stops", {}).get(where, 0) >= 1 for name in STORES)
            return reported and all(held[journal] == begin for held in self.offsets().values())

        stopped = wait_for("every consumer to stop at the lost range", stopped_there, self.args.recovery_timeout)
        apps = self.status(self.incarnations[-1]).get("apps", {})
        failed_polls = {name: apps[name]["lost_stops"][where] for name in STORES}
        reason = f"soak: fragment {begin}..{end} damaged on purpose"
        for s in self.stores.values():
            StateStore(s, APP).skip_lost(store, journal, begin, end, reason=reason)
        self.lost.append({"journal": journal, "begin": begin, "end": end, "events": events})
        return {
            "journal": journal,
            "range": [begin, end],
            "lost_messages": len(events),
            "frozen_seconds": round(frozen_for, 2),
            "stopped_at_range_after": round(stopped, 2),
            "polls_stopped_there": failed_polls,
        }

    def shard_restart(self, n: int) -> dict[str, Any]:
        i = n % len(self.shards.servers)
        self.shards.kill(i)
        time.sleep(self.args.down)
        t = time.monotonic()
        self.shards.start(i)  # the AOF is loaded before it answers
        return {"port": self.shards.servers[i].port, "down_seconds": self.args.down, "start_seconds": _since(t)}

    def cluster_failover(self, n: int) -> dict[str, Any]:
        rc = self.rc
        nodes = [*rc.servers, *(r for i in range(len(rc.servers)) for r in rc.replicas_of(i))]
        by_port = {s.port: s for s in nodes}
        rows = cluster_nodes(nodes)
        masters = sorted(
            (r for r in rows if "master" in r[2].split(",") and "fail" not in r[2] and len(r) > 8), key=node_port
        )
        victim_row = masters[n % len(masters)]
        heirs = [r for r in rows if "slave" in r[2].split(",") and r[3] == victim_row[0] and "fail" not in r[2]]
        victim, heir = by_port[node_port(victim_row)], by_port[node_port(heirs[0])]
        t = time.monotonic()
        victim.kill()

        def promoted() -> bool:
            with heir.client(socket_timeout=2) as c:
                return bool(c.info("replication")["role"] == "master")

        took_over = wait_for("the replica to take over", promoted, 60.0)
        victim.start()  # it rejoins as the replica of its heir
        rc.wait_ok(60.0)
        return {
            "killed_master": victim.port,
            "promoted": heir.port,
            "promoted_after": round(took_over, 2),
            "cluster_ok_after": _since(t),
        }

    def farm_rebuild(self, n: int) -> dict[str, Any]:
        k = n % len(self.farm_servers.servers)
        self.farm_servers.kill(k)
        time.sleep(self.args.down)  # writes go on at the quorum of the two others
        self.farm_servers.start(k)  # empty
        farm = self.stores["farm"]
        assert isinstance(farm, Farm)
        state = Walker(farm.view("zcstate:", floors=True)).run()
        data = Walker(farm).run()
        return {
            "replica": k,
            "down_seconds": self.args.down,
            "walks": {"state": _walk(state), "data": _walk(data)},
            "rebuilt": {"keys": data.keys, "diverged": data.diverged, "repaired": data.repaired + state.repaired},
            "walk_seconds": round(state.seconds + data.seconds, 2),
        }

    # -- the run -------------------------------------------------------------------------------------------

    def schedule(self) -> Iterator[tuple[float, str]]:
        """(seconds from the start, kind), ``--fault-every`` apart: the first cycle of ``--kinds`` always,
        later ones while time is left (the worker kill only in the first ``--worker-kills`` cycles)."""
        every, n = self.args.fault_every, 0
        for cycle in itertools.count():
            for kind in self.args.kinds:
                if kind == "worker-kill" and cycle >= self.args.worker_kills:
                    continue
                at = every * (n + 1)
                if cycle > 0 and at > self.args.seconds - every / 2:
                    return
                n += 1
                yield at, kind

    def run(self) -> dict[str, Any]:
        args = self.args
        with contextlib.ExitStack() as stack:
            self.shards = stack.enter_context(LocalShards(2, aof=True, extra=("--appendfsync", "always")))
            self.rc = stack.enter_context(LocalRedisCluster(3, replicas=1))
            self.farm_servers = stack.enter_context(LocalShards(3))
            self.where = {"shards": self.shards.urls, "cluster": self.rc.url, "farm": self.farm_servers.urls}
            self.journals = stack.enter_context(FileJournals(self.work / "journals", fragment_bytes=256 << 10))
            create_journals(self.journals, JOURNALS)
            self.stores = open_stores(self.where)
            stack.callback(close_stores, self.stores)
            stack.callback(self.stop_worker_quietly)
            setup = self.now()
            print(f"[{setup:7.1f}s] servers up: 2 AOF shards, a Redis Cluster 3+3, a farm of 3", flush=True)
            self.started = time.monotonic()
            publisher = threading.Thread(target=self.publisher, name="publisher", daemon=True)
            sampler = threading.Thread(target=self.sampler, name="rss", daemon=True)
            stack.callback(self.sampling.set)
            stack.callback(self.stop_publishing.set)
            self.start_worker()
            publisher.start()
            sampler.start()
            for at, kind in self.schedule():
                time.sleep(max(0.0, at - (time.monotonic() - self.started)))
                if self.publish_error is not None:
                    break
                self.inject(kind)
            time.sleep(max(0.0, args.seconds - (time.monotonic() - self.started)))
            traffic_seconds = self.now()
            self.stop_publishing.set()
            publisher.join(timeout=60)
            if self.publish_error is not None or publisher.is_alive():
                raise RuntimeError(f"the publisher failed: {self.publish_error!r}")
            final_ends = self.ends()
            drained = wait_for("the final drain", lambda: self.caught_up(final_ends), args.recovery_timeout, 0.2)
            time.sleep(1.2)  # one more RSS sample at rest
            self.sampling.set()
            sampler.join(timeout=5)
            self.end_worker("stopped")
            report = {
                "date": dt.datetime.now().isoformat(timespec="seconds"),
                "args": vars(args),
                "machine": {
                    "nproc": os.cpu_count(),
                    "loadavg_end": os.getloadavg(),
                    "python": sys.version.split()[0],
                    "redis_server": server_version(self.shards.binary).split(" sha=")[0],
                },
                "setup_seconds": setup,
                "traffic_seconds": traffic_seconds,
                "drain_seconds": round(drained, 2),
                "published": self.published(final_ends, traffic_seconds),
                "delivered": self.delivered(),
                "faults": self.faults,
                "lost_ranges": [{k: v for k, v in x.items() if k != "events"} for x in self.lost],
                "rss": self.rss_report(),
            }
            report["check"] = self.check(final_ends)
            return report

    def stop_worker_quietly(self) -> None:
        if self.worker is not None:
            with contextlib.suppress(Exception):
                self.worker.send_signal(signal.SIGCONT)
                self.end_worker("stopped at exit")

    # -- figures and the final check ------------------------------------------------------------------------

    def published(self, ends: dict[str, int], seconds: float) -> dict[str, Any]:
        t = self.traffic
        return {
            "rounds": self.rounds,
            "committed": t.committed,
            "rolled_back": t.rolled_back,
            "duplicates": t.duplicates,
            "transactions": t.transactions,
            "lost_messages": sum(len(x["events"]) for x in self.lost),
            "journal_bytes": sum(ends.values()),
            "rate": round(t.committed / max(seconds, 1e-9), 1),
        }

    def delivered(self) -> dict[str, Any]:
        """Per store, summed over every worker process: what its completed polls counted (``delivered``,
        ``frames``), its polls and failed polls. A SIGKILLed process's last poll is not counted, also where
        it had checkpointed some journals: these counts are not the exactly-once figure (the check is)."""
        out: dict[str, Any] = {}
        for name in STORES:
            apps = [i.get("apps", {}).get(name, {}) for i in self.incarnations]
            out[name] = {
                key: sum(a.get(key, 0) for a in apps) for key in ("delivered", "polls", "failed_polls", "frames")
            }
        return out

    def rss_report(self) -> dict[str, Any]:
        per = []
        for info in self.incarnations:
            mine = [(t, kb) for t, pid, kb in self.samples if pid == info["pid"]]
            warm = [(t, kb) for t, kb in mine if t >= info["started"] + self.args.warmup]
            if not warm:
                per.append({"pid": info["pid"], "lived": round(info.get("ended", self.now()) - info["started"], 1)})
                continue
            (t0, first), (t1, last) = warm[0], warm[-1]
            per.append(
                {
                    "pid": info["pid"],
                    "lived": round(info.get("ended", self.now()) - info["started"], 1),
                    "how": info.get("how"),
                    "start_at": t0,
                    "end_at": t1,
                    "start_mb": round(first / 1024, 1),
                    "end_mb": round(last / 1024, 1),
                    "max_mb": round(max(kb for _, kb in warm) / 1024, 1),
                    "ratio": round(last / first, 3),
                    "samples_mb": [(t, round(kb / 1024, 1)) for t, kb in warm[:: max(1, len(warm) // 20)]],
                }
            )
        longest = max((p for p in per if "start_mb" in p), key=lambda p: p["end_at"] - p["start_at"], default=None)
        if longest is not None:  # the trend, not two end points: a least-squares line, whole and second half
            mine = [(t, kb / 1024) for t, pid, kb in self.samples if pid == longest["pid"] and t >= longest["start_at"]]
            longest["slope_mb_per_hour"] = _slope(mine)
            longest["slope_mb_per_hour_second_half"] = _slope(mine[len(mine) // 2 :])
        series = [
            (
                t,
                pid,
                round(kb / 1024, 2),
                *((round(x / 1024, 2) for x in self.heap[t]) if t in self.heap else (None,) * 2),
            )
            for t, pid, kb in self.samples
        ]
        return {
            "warmup_seconds": self.args.warmup,
            "malloc_arena_max": self.args.malloc_arena_max,
            "processes": per,
            "longest": longest,
            "series_columns": ["t", "pid", "rss_mb", "malloc_in_use_mb", "malloc_free_mb"],
            "series": series,
        }

    def check(self, ends: dict[str, int]) -> dict[str, Any]:
        expected = self.traffic.expected()
        limit = max(len(v) for v in expected.values()) + 10
        farm = self.stores["farm"]
        assert isinstance(farm, Farm)
        out: dict[str, Any] = {"keys": len(expected), "members": sum(len(v) for v in expected.values())}
        # each replica alone first: a merged read of the farm repairs what it finds different
        out["farm_replicas"] = [compare(c, expected, limit) for c in farm.clusters]
        for name, store in self.stores.items():
            out[name] = compare(store, expected, limit)
        final = Walker(farm).run()
        out["farm_final_walk"] = _walk(final)
        out["farm_replicas_after_walk"] = [compare(c, expected, limit) for c in farm.clusters]
        offsets = self.offsets()
        out["checkpoints_at_end"] = all(held[j] == ends[j] for held in offsets.values() for j in JOURNALS)
        skips = {}
        for name, store in self.stores.items():
            audit = StateStore(store, APP).audit()
            done = {
                (a["journal"], a["begin"], a["end"]) for a in audit if a["action"] == "skip" and a["by"] == "operator"
            }
            skips[name] = all((x["journal"], x["begin"], x["end"]) in done for x in self.lost)
        out["skips_audited"] = skips
        lost = [KeyMember(f"timeline:{d['user']}", d["event"]) for x in self.lost for d in x["events"]]
        out["lost_messages_found"] = {
            name: sum(p.present for p in store.score(lost).values()) if lost else 0
            for name, store in self.stores.items()
        }
        out["ok"] = bool(
            all(out[name]["equal"] for name in STORES)
            and all(r["equal"] for r in out["farm_replicas_after_walk"])
            and out["checkpoints_at_end"]
            and all(skips.values())
            and not any(out["lost_messages_found"].values())
            and all(f.get("ok") for f in self.faults)
            and {f["kind"] for f in self.faults} == set(self.args.kinds)
        )
        return out


def _slope(points: list[tuple[float, float]]) -> float | None:
    """MB per hour of the least-squares line through ``points`` (seconds, MB); None with fewer than 2."""
    if len(points) < 2:
        return None
    n = len(points)
    mt, mm = sum(t for t, _ in points) / n, sum(m for _, m in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return round(sum((t - mt) * (m - mm) for t, m in points) / var * 3600, 2) if var else None


def plot(path: Path, r: dict[str, Any]) -> None:
    """The worker's RSS over time (one line per process), with the faults marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.5))
    pids = list(dict.fromkeys(row[1] for row in r["rss"]["series"]))
    for pid in pids:
        pts = [row for row in r["rss"]["series"] if row[1] == pid]
        ax.plot([row[0] / 60 for row in pts], [row[2] for row in pts], lw=1, label=f"worker pid {pid}: RSS")
        ax.plot([row[0] / 60 for row in pts], [row[3] for row in pts], lw=0.7, ls="--", label="malloc in use")
        ax.plot([row[0] / 60 for row in pts], [row[4] for row in pts], lw=0.7, ls=":", label="malloc free, kept")
    colors = dict(zip(KINDS, ("black", "tab:red", "tab:green", "tab:purple", "tab:orange"), strict=True))
    for kind in KINDS:
        ats = [f["at"] / 60 for f in r["faults"] if f["kind"] == kind]
        for i, at in enumerate(ats):
            ax.axvline(at, color=colors[kind], lw=0.5, alpha=0.5, label=kind if i == 0 else None)
    longest = r["rss"]["longest"] or {}
    ax.set_xlabel("minutes")
    ax.set_ylabel("worker RSS (MB)")
    ax.set_title(
        f"soak {r['traffic_seconds'] / 60:.0f} min, {len(r['faults'])} faults, {r['published']['committed']:,} "
        f"messages; RSS {longest.get('start_mb')} -> {longest.get('end_mb')} MB, "
        f"{longest.get('slope_mb_per_hour_second_half')} MB/h in the second half"
    )
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)


def _since(t: float) -> float:
    return round(time.monotonic() - t, 2)


def _walk(report: Any) -> dict[str, Any]:
    return {
        "keys": report.keys,
        "diverged": report.diverged,
        "repaired": report.repaired,
        "floors_raised": report.floors_raised,
        "failures": len(report.failures),
        "seconds": round(report.seconds, 2),
    }


def compare(store: Store, expected: dict[str, list[tuple[str, float]]], limit: int) -> dict[str, Any]:
    """``store`` against the model: every key's visible members and scores, and no key the model lacks."""
    got = store.select(list(expected), limit=limit)
    held = {str(k): [(str(t.member), t.score) for t in v] for k, v in got.items()}
    wrong = sorted(k for k in expected if held.get(k) != expected[k])
    keys = {str(k) for batch in store.keys() for k in batch}
    extra = sorted(keys - set(expected))
    missing = sum(len(set(expected[k]) - set(held.get(k, []))) for k in wrong)
    unexpected = sum(len(set(held.get(k, [])) - set(expected[k])) for k in wrong)
    return {
        "equal": not wrong and not extra,
        "wrong_keys": len(wrong),
        "missing_members": missing,
        "unexpected_members": unexpected,
        "extra_keys": extra[:10],
    }


def print_summary(r: dict[str, Any]) -> None:
    p, c = r["published"], r["check"]
    print()
    print(
        f"soak: {r['traffic_seconds']:.0f} s of traffic and faults (setup {r['setup_seconds']:.0f} s, "
        f"final drain {r['drain_seconds']:.1f} s)"
    )
    print(
        f"published: {p['committed']:,} committed messages ({p['rate']:.0f}/s) in {p['rounds']} rounds, "
        f"{p['transactions']:,} transactions, {p['rolled_back']:,} rolled-back messages, {p['duplicates']:,} "
        f"duplicated appends, {p['journal_bytes'] / 1e6:.1f} MB of journals; {p['lost_messages']} messages "
        "in damaged fragments"
    )
    exact = [name for name in STORES if c[name]["equal"]]
    print(f"delivered exactly once: every committed message's effect, in {', '.join(exact) or 'no store'}")
    for name, d in r["delivered"].items():
        print(
            f"  {name:8s} polls {d['polls']:,} ({d['failed_polls']} failed), deliveries counted by completed "
            f"polls {d['delivered']:,} (a killed process's last poll is not counted, a redelivery is)"
        )
    print("faults:")
    for f in r["faults"]:
        rec = f"recovered after {f['recovered_after']:.1f} s" if f.get("ok") else f"FAILED: {f.get('error')}"
        extra = {
            k: v
            for k, v in f.items()
            if k not in ("kind", "at", "ok", "recovered_after", "action_seconds", "trace", "walks", "error")
        }
        print(f"  {f['at']:7.1f}s {f['kind']:17s} {rec}; {extra}")
    rss = r["rss"]
    for proc in rss["processes"]:
        if "start_mb" in proc:
            print(
                f"worker pid {proc['pid']} ({proc['lived']:.0f} s, {proc['how']}): RSS {proc['start_mb']} MB at "
                f"{proc['start_at']:.0f} s -> {proc['end_mb']} MB at {proc['end_at']:.0f} s (x{proc['ratio']}, "
                f"max {proc['max_mb']} MB)"
            )
    if rss["longest"] is not None:
        print(
            f"RSS slope of the longest-lived worker: {rss['longest']['slope_mb_per_hour']} MB/h after the warm-up, "
            f"{rss['longest']['slope_mb_per_hour_second_half']} MB/h in its second half"
        )
    for name in STORES:
        s = c[name]
        print(f"  {name:8s} equals the model: {s['equal']} ({s['wrong_keys']} keys differ, extra {s['extra_keys']})")
    before = [x["equal"] for x in c["farm_replicas"]]
    after = [x["equal"] for x in c["farm_replicas_after_walk"]]
    print(f"  farm replicas equal the model: {before} each read alone, {after} after a final walk")
    print(
        f"checkpoints at the journals' ends: {c['checkpoints_at_end']}; skips audited: {c['skips_audited']}; "
        f"messages of the lost ranges found in the stores: {c['lost_messages_found']}; "
        f"{c['keys']} keys, {c['members']:,} visible members"
    )
    print("SOAK OK" if c["ok"] else "SOAK FAILED")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="traffic and faults for this long (default 60)")
    ap.add_argument(
        "--fault-every",
        type=float,
        default=None,
        help="seconds between faults (default: a sixth of --seconds, at most 15)",
    )
    ap.add_argument(
        "--kinds",
        type=lambda v: [k for k in v.split(",") if k],
        default=list(KINDS),
        help=f"the fault kinds of a cycle, in order (default: {','.join(KINDS)})",
    )
    ap.add_argument("--rate", type=float, default=150.0, help="committed messages/s published (default 150)")
    ap.add_argument("--round-steps", type=int, default=25, help="steps per producer per publish round")
    ap.add_argument("--users", type=int, default=50, help="timeline keys (default 50)")
    ap.add_argument("--lost-messages", type=int, default=20, help="messages in each damaged fragment")
    ap.add_argument("--down", type=float, default=1.0, help="seconds a killed shard or farm replica stays down")
    ap.add_argument(
        "--worker-kills",
        type=int,
        default=1,
        help="cycles whose first fault kills the worker (default "
        "1: the last worker process then lives through every later fault, for the RSS figures)",
    )
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds after a worker starts before its RSS counts")
    ap.add_argument(
        "--tracemalloc",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="trace the worker's allocations: every SECONDS after the warm-up, what grew since (by file:line and "
        "by type), saved next to the results (slows the worker down)",
    )
    ap.add_argument(
        "--malloc-arena-max",
        type=int,
        default=0,
        metavar="N",
        help="MALLOC_ARENA_MAX of the worker (default 0: glibc's own, 8 per core); glibc may give each thread an "
        "arena of its own, each keeping its own peak (docs/faults.md, Long runs)",
    )
    ap.add_argument("--recovery-timeout", type=float, default=120.0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--keep", action="store_true", help="keep the journals and worker logs")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if args.fault_every is None:
        args.fault_every = min(15.0, args.seconds / (len(KINDS) + 1))
    if not args.kinds or set(args.kinds) - set(KINDS):
        ap.error(f"--kinds: a comma-separated list of {', '.join(KINDS)}")
    logging.basicConfig(level=logging.ERROR)
    work = Path(tempfile.mkdtemp(prefix="zcluster-soak-"))
    soak = Soak(args, work)
    failed = True
    stem = "soak" if args.seconds == 60 else f"soak-{args.seconds:g}s"
    try:
        report = soak.run()
        failed = not report["check"]["ok"]
    finally:
        for n, traced in enumerate(sorted(work.glob("status-*.json.tracemalloc.txt"))):  # what --tracemalloc found
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{stem}-tracemalloc-{n}.txt").write_text(traced.read_text())
        if failed or args.keep:
            for logfile in sorted(work.glob("worker-*.log")):
                tail = logfile.read_text(errors="replace")[-3000:]
                print(f"--- {logfile.name} (last 3000 characters)\n{tail}", file=sys.stderr)
        if args.keep:
            print(f"kept {work}")
        else:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    report["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in report["args"].items()}
    path = args.out / f"{stem}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    plot(path.with_suffix(".png"), report)
    print_summary(report)
    print(f"results: {path}")
    return 0 if report["check"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
