"""The soak (``bench/soak.py``), short: about 40 s of traffic through the exactly-once consumer with every
fault kind injected once (the worker SIGKILLed, a journal fragment damaged then skipped, an AOF shard
restarted, a Redis Cluster master killed, a farm replica killed and rebuilt); then every store equals the
traffic's model except the skipped messages, and the worker's memory stayed flat. Real local servers on
loopback only; the script stops every process it started, and the whole run is bounded (~50 s here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

SOAK = Path(__file__).resolve().parents[1] / "bench" / "soak.py"
STORES = ("shards", "cluster", "farm")


@pytest.mark.timeout(420)
def test_a_week_in_a_minute(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(SOAK), "--seconds", "40", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    print(run.stdout[-8000:])  # the summary, shown with -s or on failure
    assert run.returncode == 0, f"{run.stdout[-6000:]}\n{run.stderr[-6000:]}"
    report = json.loads((tmp_path / "soak-40s.json").read_text())
    check = report["check"]

    # every fault kind happened, and the consumers caught up after each
    faults = report["faults"]
    assert {f["kind"] for f in faults} == {
        "worker-kill",
        "journal-damage",
        "shard-restart",
        "cluster-failover",
        "farm-rebuild",
    }
    assert all(f["ok"] and f["recovered_after"] < 120 for f in faults), faults
    damage = next(f for f in faults if f["kind"] == "journal-damage")
    assert all(n >= 1 for n in damage["polls_stopped_there"].values())  # each consumer stopped at the range

    # the stores equal the model, the lost messages are nowhere, the skips are audited
    for name in STORES:
        assert check[name]["equal"], (name, check[name])
    assert all(r["equal"] for r in check["farm_replicas_after_walk"]), check["farm_replicas_after_walk"]
    assert check["checkpoints_at_end"] and all(check["skips_audited"].values())
    assert report["published"]["lost_messages"] > 0
    assert check["lost_messages_found"] == dict.fromkeys(STORES, 0)
    assert check["members"] > 1000 and report["published"]["committed"] > 2000

    # the worker that lived longest kept its memory (generous: a leak per message would double it)
    longest = report["rss"]["longest"]
    assert longest is not None and longest["end_at"] - longest["start_at"] >= 15, report["rss"]
    assert longest["end_mb"] < 2 * longest["start_mb"] + 50, longest
    # the whole series is kept, each RSS sample with the worker's malloc heap (in use, free but kept), which
    # tells a leak from memory the allocator keeps; glibc's own arenas by default
    rss = report["rss"]
    assert rss["malloc_arena_max"] == 0 and rss["series_columns"][2:] == [
        "rss_mb",
        "malloc_in_use_mb",
        "malloc_free_mb",
    ]
    mine = [row for row in rss["series"] if row[1] == longest["pid"] and row[0] >= longest["start_at"]]
    # A sample taken before the new worker first wrote its status has no heap yet (a loaded machine's start).
    heaps = [row for row in mine if row[3] is not None]
    assert len(mine) >= 15 and len(heaps) >= 10 and all(row[2] > row[3] > 0 for row in heaps), mine[:5]
    assert longest["slope_mb_per_hour"] is not None
    assert (tmp_path / "soak-40s.png").stat().st_size > 0
