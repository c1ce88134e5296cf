"""A farm's repairs of counters keys in the one-key layout (fences in the totals hash), and between replicas
holding one key in either layout (one made before it, with its fences in a K- hash): compared by fences,
copied whole, fingerprinted alike."""

from __future__ import annotations

from farm_helpers import farm_of

from zcluster import Count, Fence
from zcluster._aggregate_keys import FENCE, whole_keys_of
from zcluster.farm import Walker
from zcluster.testing import LocalShards


def test_a_replica_behind_on_a_one_key_counters_key_is_repaired_to_one_key_exactly() -> None:
    with LocalShards(2) as servers:
        farm = farm_of(servers.urls, prefix="one:", repair="none")
        try:
            items = [(p, Count("hits", f"f{p % 3}", p)) for p in range(1, 31)]
            farm.increment("app/j", items[:20])
            farm.clusters[0].increment("app/j", items[20:])  # replica1 misses the last ten
            report = farm.repair_aggregates(["hits"])
            assert report.diverged == 1 and report.repaired == 1 and report.unsettled == []
            want = {"f0": sum(range(3, 31, 3)), "f1": sum(range(1, 31, 3)), "f2": sum(range(2, 31, 3))}
            for c in farm.clusters:
                assert c.counters(["hits"])["hits"] == want
                assert c.fences(["hits"])["hits"] == {"app/j": Fence((30, 0, 0), 30)}
            client = servers.servers[1].client()
            assert client.exists("{one:hits}-") == 0 and client.hget("{one:hits}+", FENCE + b"app/j") == b"30:0:0:30"
            # the repaired copy goes on counting exactly once
            assert farm.increment("app/j", [*items[25:], (31, Count("hits", "f0", 1))]).applied == [False] * 5 + [True]
            assert farm.clusters[1].counters(["hits"])["hits"]["f0"] == want["f0"] + 1
            assert farm.repair_aggregates(["hits"]).diverged == 0
        finally:
            farm.close()


def test_replicas_holding_a_counters_key_in_either_layout_compare_and_repair_by_fences() -> None:
    with LocalShards(2) as servers:
        farm = farm_of(servers.urls, prefix="mix:", repair="none")
        try:
            old = servers.servers[0].client()  # replica0: the key made before the one-key layout, written by hand
            old.hset("{mix:hits}+", mapping={"a": 7, "b": 2})
            old.hset("{mix:hits}-", "app/j", "3:0:0:3")
            farm.clusters[1].increment("app/j", [(1, Count("hits", "a", 5)), (2, Count("hits", "a", 2))])
            farm.clusters[1].increment("app/j", [(3, Count("hits", "b", 2))])  # replica1: the same, one key
            states = [whole_keys_of(c).states(["hits"])["hits"] for c in farm.clusters]
            assert states[0] == states[1] and states[0].kind == "c"
            prints = [c.fingerprints(["hits"])["hits"] for c in farm.clusters]
            assert prints[0] == prints[1] and prints[0] != b""
            assert farm.repair_aggregates(["hits"]).diverged == 0
            farm.clusters[0].increment("app/j", [(4, Count("hits", "b", 1))])  # the old key moves ahead
            assert old.hget("{mix:hits}-", "app/j") == b"4:0:0:4"  # its fences stay in K-
            assert Walker(farm).run().repaired == 1
            new = servers.servers[1].client()  # replica1 took the old copy's state, in the one-key layout
            assert new.exists("{mix:hits}-") == 0
            assert new.hgetall("{mix:hits}+") == {b"a": b"7", b"b": b"3", FENCE + b"app/j": b"4:0:0:4"}
            assert farm.counters(["hits"])["hits"] == {"a": 7, "b": 3}
            assert farm.increment("app/j", [(4, Count("hits", "b", 1)), (5, Count("hits", "b", 1))]).applied == [
                False,
                True,
            ]
            assert [c.counters(["hits"])["hits"] for c in farm.clusters] == [{"a": 7, "b": 4}] * 2
        finally:
            farm.close()
