"""Instructions per tuple or message, counted by ``valgrind --tool=callgrind``: load-independent figures.

Wall time on a shared machine moves with whatever else runs; an instruction count does not (two runs agree
to a fraction of a percent). Every figure here is a difference of two sizes: a workload of n1 units and one
of n2 units run in the same counted process, each between a ``callgrind_control --zero`` and a
``callgrind_control --dump``, per unit = (I(n2) - I(n1)) / (n2 - n1), so that connecting, loading scripts,
creating objects and every other fixed cost cancels. A smaller warm-up run comes first, uncounted, so that
first-call costs (lazy imports, script loading, caches) fall in neither size.

(a) The server's side: one ``redis-server`` under callgrind, driven from this process (not counted), every
    run from FLUSHALL with fresh tuples:
    * ``script``: ``Cluster.insert`` (the 2P-set write script, the library's default batching) per tuple,
      against ``zadd``: redis-py pipelined plain ``ZADD`` (pipelines of 1,000) of the same tuples, per
      command; at spread keys (``--spread`` keys, about one tuple per key per call) and hot keys (``--hot``
      keys); ``script-delete``: ``Cluster.delete`` of members never inserted (tombstones) at spread keys;
      ``script-bounded``: ``Cluster.insert`` with ``max_size`` (no trimming at these sizes) at spread keys;
    * ``incr``: ``Cluster.increment`` (fenced, one source, calls of 10,000) per increment, against
      ``zincrby``: pipelined ``ZINCRBY``, per command; spread and hot keys.
    Goals (issue #40): script / ZADD <= 1.5 and increments / ZINCRBY <= 1.5, per tuple.
(b) The client's side: this file run again as a worker under callgrind (Python), a local ``redis-server``
    (not counted) behind it:
    * ``consumer``: zcluster's exactly-once :class:`zcluster.state.Consumer` polling file journals of
      synthetic timeline traffic (:func:`zcluster.testing.traffic.publish`: transactions, rollbacks,
      duplicates) with :func:`zcluster.testing.traffic.timeline_mapper`: frames read, sequenced, mapped,
      written, checkpointed; per committed message;
    * ``hand``: a hand-written at-least-once loop over the same journals' bytes (plain ndjson copies):
      ``orjson.loads`` per line, ACKs skipped, redis-py pipelined ZADD/ZREM (pipelines of 1,000), no
      sequencing (so duplicates and rolled-back messages are written too); per committed message, the same
      denominator as ``consumer``;
    * ``insert``: ``Cluster.insert`` per tuple (spread keys), the tuples built before the counted part.
    Goal (issue #40): consumer <= 25,000 instructions per committed message.

(c) Not counted: the ``consumer`` and the ``hand`` loop of (b) again in this process, without callgrind,
    alternately, in committed messages per second on one thread, by wall time (the local server's work
    included) and by the client's CPU time; medians of 5 runs each (issue #40 asks for the rate too).

Results: ``bench/results/instructions[-rate][-LABEL][-quick].{json,png}`` (``-rate`` with ``--only rate``, no
plot); ``--label before`` run with ``PYTHONPATH`` at another checkout counts that checkout's code (its ``lua/``
comes with its package).

    python bench/bench_instructions.py                 # (a), (b) and (c) (~12 min on a quiet machine)
    python bench/bench_instructions.py --quick         # smaller sizes (~3 min)
    python bench/bench_instructions.py --only client   # or --only server
    python bench/bench_instructions.py --only rate     # (c) only: messages/s, no callgrind (~2 min)
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
HERE = Path(__file__).resolve().parent
PIPELINE = 1_000
INCR_CALL = 10_000
POLL = 0.02  # seconds between a waiting worker's looks at the control folder


# -- callgrind control -----------------------------------------------------------------------------------------


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True, timeout=600)


def _dumps(folder: Path) -> set[Path]:
    return {p for p in folder.iterdir() if p.name.startswith("cg.")}


def counted(pid: int, folder: Path, run: Callable[[], Any]) -> int:
    """Instructions the callgrind'd process ``pid`` executed while ``run()`` ran (zeroed before, dumped after)."""
    _control(pid, "--zero")
    run()
    before = _dumps(folder)
    _control(pid, "--dump")
    new = _dumps(folder) - before
    if len(new) != 1:
        raise RuntimeError(f"expected one new callgrind dump in {folder}, found {sorted(new)}")
    for line in new.pop().read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError("no summary line in the callgrind dump")


def per_unit(counts: dict[int, int]) -> float:
    """(I(n2) - I(n1)) / (n2 - n1) from {n: instructions} of two sizes."""
    (n1, i1), (n2, i2) = sorted(counts.items())
    return (i2 - i1) / (n2 - n1)


def valgrind(out: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p", f"--log-file={out}/valgrind.%p.log"]


# -- (a) the server's side -------------------------------------------------------------------------------------


class CountedServer:
    """A ``redis-server`` under callgrind on a free loopback port (no persistence; ``hz 1`` keeps the
    background cron, which runs by wall time and so differs between sizes, to a tick a second)."""

    def __init__(self, folder: Path, extra: tuple[str, ...] = ()) -> None:
        from zcluster.testing._local import find_server_binary
        from zcluster.testing._process import free_port

        self.folder = folder
        self.port = free_port()
        cmd = [
            *valgrind(folder),
            find_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--hz",
            "1",
            "--dir",
            str(folder),
            "--logfile",
            str(folder / "redis.log"),
            *extra,
        ]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}"
        import redis

        self.client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 120
        while True:
            try:
                if self.client.ping():
                    break
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server under valgrind did not start") from None
                time.sleep(0.2)

    def count(self, run: Callable[[], Any]) -> int:
        return counted(self.process.pid, self.folder, run)

    def close(self) -> None:
        self.client.close()
        self.process.terminate()
        self.process.wait(timeout=120)


def tuples(n: int, keys: int, seed: int) -> list[tuple[str, float, str]]:
    rng = random.Random(seed)
    return [(f"k{rng.randrange(keys)}", float(rng.randrange(1 << 40)), f"m{seed}:{i}") for i in range(n)]


def increments(n: int, keys: int, seed: int) -> list[tuple[str, str, float]]:
    rng = random.Random(seed)
    return [(f"lb:{rng.randrange(keys)}", f"u{rng.randrange(50)}", float(rng.randint(1, 5))) for _ in range(n)]


def zadd_all(client: Any, items: list[tuple[str, float, str]]) -> None:
    for lo in range(0, len(items), PIPELINE):
        pipe = client.pipeline(transaction=False)
        for key, score, member in items[lo : lo + PIPELINE]:
            pipe.zadd(key, {member: score})
        pipe.execute()


def zincrby_all(client: Any, items: list[tuple[str, str, float]]) -> None:
    for lo in range(0, len(items), PIPELINE):
        pipe = client.pipeline(transaction=False)
        for key, member, delta in items[lo : lo + PIPELINE]:
            pipe.zincrby(key, delta, member)
        pipe.execute()


def server_side(sizes: tuple[int, int], spread: int, hot: int, select: tuple[str, ...] = ()) -> dict[str, Any]:
    """Per tuple (or increment) instructions of the server for each workload (those whose names start with
    one of ``select``, when given), and the ratios of those counted. The ``module`` workloads are the
    ``script`` ones on a second server that loads zcluster's Redis module (the client then sends them as
    ``ZCLUSTER.WRITE``)."""
    from zcluster._server_module import loadmodule

    out: dict[str, Any] = {}
    for extra, family in (((), "script"), (tuple(loadmodule()), "module")):
        if select and not any(p.startswith("module") == (family == "module") for p in select):
            continue
        with tempfile.TemporaryDirectory(prefix="zc-callgrind-") as tmp:
            server = CountedServer(Path(tmp), extra)
            try:
                _count_workloads(server, family, sizes, spread, hot, select, out)
            finally:
                server.close()
    pairs = {
        "script/zadd spread": ("script/spread", "zadd/spread"),
        "script/zadd unique": ("script/unique", "zadd/unique"),
        "script/zadd hot": ("script/hot", "zadd/hot"),
        "dirty/zadd spread": ("script-dirty/spread", "zadd/spread"),
        "dirty/zadd hot": ("script-dirty/hot", "zadd/hot"),
        "delete/zadd spread": ("script-delete/spread", "zadd/spread"),
        "delete/zadd hot": ("script-delete/hot", "zadd/hot"),
        "tombstone/zadd spread": ("script-tombstone/spread", "zadd/spread"),
        "bounded/zadd spread": ("script-bounded/spread", "zadd/spread"),
        "module/zadd spread": ("module/spread", "zadd/spread"),
        "module/zadd unique": ("module/unique", "zadd/unique"),
        "module/zadd hot": ("module/hot", "zadd/hot"),
        "module-dirty/zadd spread": ("module-dirty/spread", "zadd/spread"),
        "module-dirty/zadd hot": ("module-dirty/hot", "zadd/hot"),
        "module-delete/zadd spread": ("module-delete/spread", "zadd/spread"),
        "module-delete/zadd hot": ("module-delete/hot", "zadd/hot"),
        "module-tombstone/zadd spread": ("module-tombstone/spread", "zadd/spread"),
        "module-incr/zincrby spread": ("module-incr/spread", "zincrby/spread"),
        "module-incr/zincrby hot": ("module-incr/hot", "zincrby/hot"),
        "incr/zincrby spread": ("incr/spread", "zincrby/spread"),
        "incr/zincrby hot": ("incr/hot", "zincrby/hot"),
    }
    ratios = {name: out[a]["per_unit"] / out[b]["per_unit"] for name, (a, b) in pairs.items() if a in out and b in out}
    return {"workloads": out, "ratios": ratios}


MODULE_WORKLOADS = (
    *(f"module{kind}/{shape}" for kind in ("", "-dirty", "-delete", "-incr") for shape in ("spread", "hot")),
    "module/unique",
    "module-tombstone/spread",
)
"""The workloads counted on the module's server: the script's 2P-set writes and the increments."""


def _count_workloads(
    server: CountedServer,
    family: str,
    sizes: tuple[int, int],
    spread: int,
    hot: int,
    select: tuple[str, ...],
    out: dict[str, Any],
) -> None:
    """Count ``family``'s workloads on ``server`` into ``out``: on the module's server, the 2P-set writes
    under the names ``module...`` (the same workloads as ``script...``); elsewhere all of them."""
    from zcluster import Cluster, Incr

    plain = Cluster.from_urls([server.url], prefix="b:")
    bounded = Cluster.from_urls([server.url], prefix="b:", max_size=100_000)

    def incr_all(items: list[tuple[str, str, float]], source: str) -> None:
        for lo in range(0, len(items), INCR_CALL):
            batch = items[lo : lo + INCR_CALL]
            plain.increment(source, [(lo + i, Incr(k, m, d)) for i, (k, m, d) in enumerate(batch)])

    def later(setup: Callable[[], Any], run: Callable[[], Any]) -> Callable[[], Any]:
        setup()  # before the count starts
        return run

    def tombstones(keys: int) -> list[tuple[str, float, str]]:
        return [(f"k{i}", 1.0, "gone") for i in range(keys)]

    def raised(items: list[tuple[str, float, str]]) -> list[tuple[str, float, str]]:
        return [(k, score + 1, m) for k, score, m in items]

    workloads: dict[str, tuple[Callable[[int, int], Callable[[], Any]], int]] = {
        "script/spread": (lambda n, s: lambda: plain.insert(tuples(n, spread, s)), spread),
        "zadd/spread": (lambda n, s: lambda: zadd_all(server.client, tuples(n, spread, s)), spread),
        # Every tuple alone in its set (ten times as many keys as tuples, at both sizes): spread keys
        # as a stream of many users writes them, where no group shares a set's keys or count.
        "script/unique": (lambda n, s: lambda: plain.insert(tuples(n, 10 * n, s)), 0),
        "zadd/unique": (lambda n, s: lambda: zadd_all(server.client, tuples(n, 10 * n, s)), 0),
        "script/hot": (lambda n, s: lambda: plain.insert(tuples(n, hot, s)), hot),
        "zadd/hot": (lambda n, s: lambda: zadd_all(server.client, tuples(n, hot, s)), hot),
        "script-dirty/spread": (
            lambda n, s: later(lambda: plain.delete(tombstones(spread)), lambda: plain.insert(tuples(n, spread, s))),
            spread,
        ),
        "script-dirty/hot": (
            lambda n, s: later(lambda: plain.delete(tombstones(hot)), lambda: plain.insert(tuples(n, hot, s))),
            hot,
        ),
        "script-delete/spread": (
            lambda n, s: later(
                lambda: plain.insert(tuples(n, spread, s)), lambda: plain.delete(raised(tuples(n, spread, s)))
            ),
            spread,
        ),
        "script-delete/hot": (
            lambda n, s: later(
                lambda: plain.insert(tuples(n, hot, s)), lambda: plain.delete(raised(tuples(n, hot, s)))
            ),
            hot,
        ),
        "script-tombstone/spread": (lambda n, s: lambda: plain.delete(tuples(n, spread, s)), spread),
        "script-bounded/spread": (lambda n, s: lambda: bounded.insert(tuples(n, spread, s)), spread),
        "incr/spread": (lambda n, s: lambda: incr_all(increments(n, spread * 10, s), f"src{s}"), spread),
        "zincrby/spread": (
            lambda n, s: lambda: zincrby_all(server.client, increments(n, spread * 10, s)),
            spread,
        ),
        "incr/hot": (lambda n, s: lambda: incr_all(increments(n, hot, s), f"src{s}"), hot),
        "zincrby/hot": (lambda n, s: lambda: zincrby_all(server.client, increments(n, hot, s)), hot),
    }
    if family == "module":  # the module's server serves the 2P-set writes: named apart, the rest left out
        renamed = {"module" + name[len("script") :]: w for name, w in workloads.items() if name.startswith("script")}
        renamed |= {"module-" + name: w for name, w in workloads.items() if name.startswith("incr/")}
        workloads = {name: w for name, w in renamed.items() if name in MODULE_WORKLOADS}
    for name, (make, _) in workloads.items():
        if select and not name.startswith(select):
            continue
        server.client.flushall()
        make(max(100, sizes[0] // 10), 1)()  # warm-up: the script loaded, first calls done
        counts: dict[int, int] = {}
        for seed, n in enumerate(sizes, start=2):
            server.client.flushall()
            # The tuples are built here (client side, not counted by the server): only sends count.
            run = make(n, seed)
            counts[n] = server.count(run)
        out[name] = {"counts": counts, "per_unit": per_unit(counts)}
        print(f"  server {name:<24} {out[name]['per_unit']:>10,.0f} instructions per unit", flush=True)
    plain.close()
    bounded.close()


# -- (b) the client's side -------------------------------------------------------------------------------------


def publish_timelines(root: Path, steps: int, users: int, seed: int) -> dict[str, Any]:
    """File journals of timeline traffic under ``root/journals`` and their bytes as ndjson under
    ``root/text``; returns the committed message count and the paths."""
    from zcluster.journal import FileJournals
    from zcluster.testing.traffic import Traffic, create_journals, publish

    jdir, tdir = root / "journals", root / "text"
    tdir.mkdir(parents=True)
    store = FileJournals(str(jdir))
    names = [f"timelines/part-{i:03d}" for i in range(4)]
    create_journals(store, names)
    traffic = publish(store, Traffic(names), producers=4, messages=steps, users=users, seed=seed)
    for i, name in enumerate(names):
        data = b"".join(chunk for _, chunk in store.read(name, 0))[: store.end(name)]
        (tdir / f"part-{i:03d}.ndjson").write_bytes(data)
    store.close()
    return {"url": "file://" + str(jdir), "text": str(tdir), "committed": traffic.committed}


def worker(job: dict[str, Any]) -> None:
    """Run under callgrind: for each phase, set up, say ready, wait for go, run, say done, wait for next."""
    ctl = Path(job["ctl"])

    def wait(name: str) -> None:
        while not (ctl / name).exists():
            time.sleep(POLL)

    kind, url = job["kind"], job["redis"]
    for i, phase in enumerate(job["phases"]):
        run = _client_run(kind, url, phase, i)
        # A full collection owed by start-up (or by the phase before) must not land inside one size only:
        # the difference of two sizes would charge it to the messages. Both kinds start each phase collected.
        gc.collect()
        (ctl / f"ready-{i}").write_text(str(os.getpid()))
        wait(f"go-{i}")
        run()
        (ctl / f"done-{i}").write_text("")
        wait(f"next-{i}")


def _client_run(kind: str, url: str, phase: dict[str, Any], i: int) -> Callable[[], Any]:
    if kind == "consumer":
        from zcluster import Cluster
        from zcluster.state import Consumer
        from zcluster.testing.traffic import timeline_mapper

        cluster = Cluster.from_urls([url], prefix=f"c{i}:")
        consumer = Consumer(cluster, phase["url"], timeline_mapper, f"bench-instr-{i}")
        return consumer.poll
    if kind == "hand":
        import orjson
        import redis

        client = redis.Redis.from_url(url)
        files = sorted(Path(phase["text"]).iterdir())

        def hand() -> None:
            pipe, pending = client.pipeline(transaction=False), 0
            for path in files:
                with open(path, "rb") as f:
                    for line in f:
                        doc = orjson.loads(line)
                        user = doc.get("user")
                        if user is None:
                            continue  # an ACK
                        key = f"h{i}:timeline:{user}"
                        if doc["op"] == "remove":
                            pipe.zrem(key, str(doc["event"]))
                        else:
                            pipe.zadd(key, {str(doc["event"]): float(doc["ts"])})
                        pending += 1
                        if pending >= PIPELINE:
                            pipe.execute()
                            pending = 0
            if pending:
                pipe.execute()

        return hand
    if kind == "insert":
        from zcluster import Cluster

        cluster = Cluster.from_urls([url], prefix=f"i{i}:")
        items = tuples(phase["n"], phase["keys"], i)
        return lambda: cluster.insert(items)
    raise ValueError(kind)


def client_count(kind: str, url: str, phases: list[dict[str, Any]], folder: Path) -> list[int]:
    """Instructions of each phase of ``kind`` in a worker under callgrind (the first phase is the warm-up)."""
    ctl = folder / f"ctl-{kind}"
    ctl.mkdir()
    job = {"kind": kind, "redis": url, "phases": phases, "ctl": str(ctl)}
    env = dict(os.environ, PYTHONHASHSEED="0")
    cmd = [*valgrind(folder), sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(job)]
    proc = subprocess.Popen(cmd, env=env)
    counts = []
    try:
        for i in range(len(phases)):
            while not (ctl / f"ready-{i}").exists():
                if proc.poll() is not None:
                    raise RuntimeError(f"the {kind} worker exited ({proc.returncode}); see {folder}")
                time.sleep(POLL)

            def go(i: int = i) -> None:
                (ctl / f"go-{i}").write_text("")
                while not (ctl / f"done-{i}").exists():
                    if proc.poll() is not None:
                        raise RuntimeError(f"the {kind} worker exited ({proc.returncode})")
                    time.sleep(POLL)

            counts.append(counted(proc.pid, folder, go))
            (ctl / f"next-{i}").write_text("")
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return counts


def client_side(
    steps: tuple[int, int], insert_sizes: tuple[int, int], users: int, server: list[str] | None = None
) -> dict[str, Any]:
    """``server``: the local server's options (``--module``: it loads zcluster's Redis module)."""
    from zcluster.testing import LocalShards

    out: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="zc-callgrind-client-") as tmp,
        LocalShards(1, extra=server or []) as shards,
    ):
        root = Path(tmp)
        journals = [
            publish_timelines(root / f"j{i}", s, users, seed=i) for i, s in enumerate((max(20, steps[0] // 10), *steps))
        ]
        for kind in ("consumer", "hand"):
            counts = client_count(kind, shards.urls[0], journals, root)
            per = {j["committed"]: c for j, c in zip(journals[1:], counts[1:], strict=True)}
            out[kind] = {"counts": per, "per_unit": per_unit(per), "unit": "committed message"}
            print(f"  client {kind:<24} {out[kind]['per_unit']:>10,.0f} instructions per committed message")
        phases = [{"n": n, "keys": 10_000} for n in (max(100, insert_sizes[0] // 10), *insert_sizes)]
        counts = client_count("insert", shards.urls[0], phases, root)
        per = {p["n"]: c for p, c in zip(phases[1:], counts[1:], strict=True)}
        out["insert"] = {"counts": per, "per_unit": per_unit(per), "unit": "tuple"}
        print(f"  client {'Cluster.insert':<24} {out['insert']['per_unit']:>10,.0f} instructions per tuple")
    ratios = {"consumer/hand": out["consumer"]["per_unit"] / out["hand"]["per_unit"]}
    return {"workloads": out, "ratios": ratios}


def client_rates(steps: int, users: int, repeat: int, server: list[str] | None = None) -> dict[str, Any]:
    """Committed messages per second on one thread, not under callgrind: the ``consumer`` and the ``hand``
    loop of :func:`client_side` over the same journals in this process, alternately, ``repeat`` times each
    after one uncounted pair (imports, script loading); by wall time (the server's work included, as a user
    sees it) and by this process's CPU time (the client's own cost). Medians, and consumer / hand."""
    from statistics import median

    from zcluster.testing import LocalShards

    runs: dict[str, list[dict[str, float]]] = {"consumer": [], "hand": []}
    with tempfile.TemporaryDirectory(prefix="zc-rate-") as tmp, LocalShards(1, extra=server or []) as shards:
        job = publish_timelines(Path(tmp) / "j", steps, users, seed=7)
        committed = job["committed"]
        for r in range(repeat + 1):
            for kind in runs:
                run = _client_run(kind, shards.urls[0], job, 1_000 + r)  # fresh keys and application per run
                wall, cpu = time.perf_counter(), time.process_time()
                run()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                if r:
                    runs[kind].append({"wall_s": wall, "cpu_s": cpu})
    out: dict[str, Any] = {"committed": committed, "repeat": repeat}
    for kind, samples in runs.items():
        out[kind] = {
            "samples": samples,
            "per_s": median(committed / x["wall_s"] for x in samples),
            "per_cpu_s": median(committed / x["cpu_s"] for x in samples),
        }
        print(
            f"  rate {kind:<26} {out[kind]['per_s']:>10,.0f} messages/s "
            f"({out[kind]['per_cpu_s']:,.0f} per second of client CPU)"
        )
    out["ratios"] = {
        "consumer/hand by wall": out["consumer"]["per_s"] / out["hand"]["per_s"],
        "consumer/hand by client CPU": out["consumer"]["per_cpu_s"] / out["hand"]["per_cpu_s"],
    }
    return out


# -- report ----------------------------------------------------------------------------------------------------


def plot(path: Path, report: dict[str, Any]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    sides = [s for s in ("server", "client") if s in report]
    fig, axes = plt.subplots(1, len(sides), figsize=(6.5 * len(sides), 4.5), squeeze=False)
    for ax, side in zip(axes[0], sides, strict=True):
        names = list(report[side]["workloads"])
        values = [report[side]["workloads"][n]["per_unit"] for n in names]
        ax.barh(
            names,
            values,
            color=["#c44e52" if not n.startswith(("zadd", "zincrby", "hand")) else "#4c72b0" for n in names],
        )
        ax.invert_yaxis()
        ax.set_xlabel("instructions per tuple / increment / committed message")
        ax.set_title(f"{side} side (callgrind)")
        for y, v in enumerate(values):
            ax.text(v, y, f" {v:,.0f}", va="center", fontsize=8)
    fig.suptitle(f"bench_instructions {report.get('label') or ''} {report['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=("server", "client", "rate"), help="rate: messages/s, no callgrind")
    ap.add_argument("--label", default="", help="results file suffix, e.g. before / after")
    ap.add_argument("--spread", type=int, default=10_000, help="keys of the spread shape (server side)")
    ap.add_argument("--hot", type=int, default=100, help="keys of the hot shape (server side)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--module", action="store_true", help="client and rate: the local server loads the module")
    ap.add_argument("--select", default="", help="server workloads whose names start with these (comma-separated)")
    args = ap.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    import zcluster
    from zcluster._server_module import loadmodule

    server = loadmodule() if args.module else []
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "label": args.label,
        "zcluster": str(Path(zcluster.__file__).parent),
        "quick": args.quick,
        "module": args.module,
    }
    print(f"counting zcluster from {report['zcluster']}", flush=True)
    if args.only in (None, "server"):
        sizes = (5_000, 15_000) if args.quick else (10_000, 30_000)
        select = tuple(p for p in args.select.split(",") if p)
        report["server"] = server_side(sizes, args.spread, args.hot, select)
        report["server"]["sizes"] = sizes
    if args.only in (None, "client"):
        steps = (150, 600) if args.quick else (500, 2_000)
        inserts = (2_000, 8_000) if args.quick else (5_000, 20_000)
        report["client"] = client_side(steps, inserts, users=20_000, server=server)
    if args.only in (None, "rate"):
        report["rate"] = client_rates(
            600 if args.quick else 5_000, users=20_000, repeat=1 if args.quick else 5, server=server
        )
    for side in ("server", "client", "rate"):
        for name, ratio in report.get(side, {}).get("ratios", {}).items():
            print(f"  ratio {name:<28} {ratio:.2f}")
    RESULTS.mkdir(exist_ok=True)
    stem = "instructions" + ("-rate" if args.only == "rate" else "")
    stem += (f"-{args.label}" if args.label else "") + ("-quick" if args.quick else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    if not args.no_plot and ("server" in report or "client" in report):
        plot(RESULTS / f"{stem}.png", report)
    print(f"saved {RESULTS / stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
