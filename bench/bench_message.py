"""Message-layer throughput: Sequencer messages/s (committed messages, 1% duplicates) and UUID
build+parse rates. Prints medians of several runs; writes bench/results/message.json and, when
matplotlib is installed, bench/results/message.png."""

from __future__ import annotations

import json
import platform
import random
import statistics
import time
from pathlib import Path

from zcluster.message import Envelope, Flags, Sequencer, build_uuid, get_clock, get_flags, new_producer_id

RESULTS = Path(__file__).parent / "results"
RUNS = 7
N_MESSAGES = 200_000
N_UUIDS = 500_000


def committed_envelopes(n: int, producers: int = 8, dup_rate: float = 0.01) -> list[Envelope]:
    rng = random.Random(42)
    pids = [new_producer_id() for _ in range(producers)]
    clocks = [1 << 60] * producers
    sent: list[list[bytes]] = [[] for _ in range(producers)]
    out: list[Envelope] = []
    offset = 0
    for _ in range(n):
        i = rng.randrange(producers)
        if sent[i] and rng.random() < dup_rate:
            uuid = sent[i][max(0, len(sent[i]) - rng.randrange(1, 50))]  # A re-appended earlier message.
        else:
            clocks[i] += 160
            uuid = build_uuid(pids[i], clocks[i], Flags.OUTSIDE_TXN)
            sent[i].append(uuid)
        out.append(Envelope("bench/journal", offset, offset + 100, None, uuid))
        offset += 100
    return out


def bench_sequencer(envs: list[Envelope]) -> tuple[float, int]:
    seq = Sequencer(buffer=1024)
    queue, step = seq.queue_uncommitted, seq.step
    delivered = 0
    t0 = time.perf_counter()
    for env in envs:
        queue(env)
        while step() is not None:
            delivered += 1
    return len(envs) / (time.perf_counter() - t0), delivered


def bench_uuid_build(n: int) -> float:
    pid = new_producer_id()
    clock = 1 << 60
    t0 = time.perf_counter()
    for c in range(clock, clock + n):
        build_uuid(pid, c, 0)
    return n / (time.perf_counter() - t0)


def bench_uuid_parse(n: int) -> float:
    uuids = [build_uuid(new_producer_id(), (1 << 60) + i, i & 3) for i in range(1000)] * (n // 1000)
    t0 = time.perf_counter()
    for u in uuids:
        get_clock(u)
        get_flags(u)
    return len(uuids) / (time.perf_counter() - t0)


def main() -> None:
    envs = committed_envelopes(N_MESSAGES)
    seq_runs, build_runs, parse_runs = [], [], []
    for _ in range(RUNS):
        rate, delivered = bench_sequencer(envs)
        seq_runs.append(rate)
        build_runs.append(bench_uuid_build(N_UUIDS))
        parse_runs.append(bench_uuid_parse(N_UUIDS))
    result = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "runs": RUNS,
        "sequencer": {
            "messages": N_MESSAGES,
            "delivered": delivered,
            "duplicates": N_MESSAGES - delivered,
            "messages_per_s": statistics.median(seq_runs),
            "all": seq_runs,
            "goal": 300_000,
        },
        "uuid_build": {"per_s": statistics.median(build_runs), "all": build_runs, "goal": 1_000_000},
        "uuid_parse": {"per_s": statistics.median(parse_runs), "all": parse_runs},
    }
    print(
        f"Sequencer: {result['sequencer']['messages_per_s']:,.0f} messages/s "
        f"({N_MESSAGES - delivered} duplicates dropped of {N_MESSAGES})"
    )
    print(f"UUID build: {result['uuid_build']['per_s']:,.0f} UUIDs/s")
    print(f"UUID parse (clock+flags): {result['uuid_parse']['per_s']:,.0f} UUIDs/s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "message.json").write_text(json.dumps(result, indent=2) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    names = ["Sequencer msgs/s", "UUID builds/s", "UUID parses/s"]
    values = [
        result["sequencer"]["messages_per_s"],
        result["uuid_build"]["per_s"],
        result["uuid_parse"]["per_s"],
    ]
    goals = [300_000, 1_000_000, None]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(names, values, color=["#4c72b0", "#55a868", "#8172b2"])
    for i, g in enumerate(goals):
        if g:
            ax.hlines(g, i - 0.4, i + 0.4, colors="red", linestyles="--", label="goal" if i == 0 else None)
    ax.set_ylabel(f"per second (median of {RUNS} runs)")
    ax.set_title("zcluster.message throughput")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "message.png", dpi=120)
    print(f"wrote {RESULTS / 'message.json'} and {RESULTS / 'message.png'}")


if __name__ == "__main__":
    main()
