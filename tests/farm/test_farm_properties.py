"""A property: random histories of inserts and deletes (ties, duplicates), each write applied to a random
non-empty subset of the replicas in a random order, then reads under a drawn strategy and a full walk,
leave every replica holding exactly the model's records and the farm answering the model's sets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from farm_helpers import Model, farm_of, held, pairs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zcluster import Delete, Insert, KeyMember
from zcluster.farm import (
    RepairAll,
    SendAllReadAll,
    SendAllReadFirstLinger,
    SendOneReadOne,
    SendVarReadFirstLinger,
    Walker,
)
from zcluster.testing import LocalShards
from zcluster.types import NOT_PRESENT, Presence, Write

KEYS = ["a", "b", "c"]
MEMBERS = ["x", "y", "z", "w"]


@pytest.fixture(scope="module")
def servers() -> Iterator[LocalShards]:
    with LocalShards(3) as s:
        yield s


writes = st.builds(
    lambda op, key, score, member: op(key, float(score), member),
    st.sampled_from([Insert, Delete]),
    st.sampled_from(KEYS),
    st.integers(0, 3),  # few scores: ties between inserts and deletes are common
    st.sampled_from(MEMBERS),
)
replica_sets = st.sets(st.integers(0, 2), min_size=1)
reads = st.sampled_from(
    [
        SendAllReadAll(),
        SendAllReadFirstLinger(),
        SendOneReadOne(),
        SendVarReadFirstLinger(per_second=0.01, threshold=0.0),
    ]
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=st.lists(st.tuples(writes, replica_sets), max_size=30), read=reads, data=st.data())
def test_replicas_converge_to_the_model(
    servers: LocalShards, history: list[tuple[Write, set[int]]], read: Any, data: st.DataObject
) -> None:
    for server in servers.servers:
        with server.client() as r:
            r.flushall()
    model = Model()
    per_replica: list[list[Write]] = [[], [], []]
    for write, replicas in history:
        model.apply(write)
        for i in replicas:
            per_replica[i].append(write)
    duplicates = data.draw(st.lists(st.integers(0, max(len(history) - 1, 0)), max_size=5)) if history else []
    for j in duplicates:  # a write delivered twice to one of its replicas
        write, replicas = history[j]
        per_replica[min(replicas)].append(write)
    with farm_of(servers.urls, read=read, repair=RepairAll()) as farm:
        for cluster, own in zip(farm.clusters, per_replica, strict=True):
            for write in data.draw(st.permutations(own)):
                cluster.apply([write])
        visible = {k: model.visible(k) for k in KEYS}
        kms = [KeyMember(k, m) for k in KEYS for m in MEMBERS]
        expected_scores = {
            km: Presence(True, *model.records[km.key][km.member])
            if km.member in model.records.get(km.key, {})
            else None
            for km in kms
        }
        got = farm.select(KEYS, limit=100)
        scores = farm.score(kms)
        if isinstance(read, SendAllReadAll):  # the merge itself is exact, before any repair
            assert {k: pairs(v) for k, v in got.items()} == visible
            for km in kms:
                want = expected_scores[km]
                assert scores[km] == want if want is not None else scores[km] is NOT_PRESENT or not scores[km].present
        assert farm.flush_repairs(timeout=120)
        report = Walker(farm, batch_size=2).run()
        assert report.position is None and report.failures == [] and report.repair_failures == 0
        for cluster in farm.clusters:
            assert held(cluster, KEYS) == {k: model.held(k) for k in KEYS}
        assert {k: pairs(v) for k, v in farm.select(KEYS, limit=100).items()} == visible
        for km in kms:
            want = expected_scores[km]
            presence = farm.score([km])[km]
            assert presence == want if want is not None else not presence.present
        assert farm.flush_repairs(timeout=120)
        assert Walker(farm).run().diverged == 0
