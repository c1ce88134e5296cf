"""FarmConfig and store_config: what the sink and the state layer are given."""

from __future__ import annotations

import pickle

import pytest

from zcluster import ClusterConfig, ConfigError
from zcluster.config import store_config
from zcluster.farm import FarmConfig


def test_store_config_sets_a_given_layout_on_every_form_and_keeps_an_absent_one() -> None:
    farm = FarmConfig.of(["redis://127.0.0.1:1", ["redis://127.0.0.1:2", "redis://127.0.0.1:3"]], prefix="p:")
    assert {r.prefix for r in store_config(farm).replicas} == {"p:"}  # type: ignore[union-attr]
    moved = store_config(farm, prefix="q:", max_size=10)
    assert isinstance(moved, FarmConfig)
    assert {(r.prefix, r.max_size) for r in moved.replicas} == {("q:", 10)}
    single = ClusterConfig.of("redis://127.0.0.1:1", prefix="p:")
    assert store_config(single) == single
    assert store_config(single, prefix="q:").prefix == "q:"  # type: ignore[union-attr]
    assert store_config("redis://127.0.0.1:1").prefix == "zc:"  # type: ignore[union-attr]


def test_farm_config_is_a_hashable_picklable_value_and_checks_itself() -> None:
    farm = FarmConfig.of(["redis://127.0.0.1:1", "redis://127.0.0.1:2"], write_quorum="100%", read="one")
    assert pickle.loads(pickle.dumps(farm)) == farm and hash(farm) == hash(pickle.loads(pickle.dumps(farm)))
    with pytest.raises(ConfigError):
        FarmConfig.of(["redis://127.0.0.1:1"], write_quorum="110%")
    with pytest.raises(ConfigError):
        FarmConfig.of(["redis://127.0.0.1:1"], read="sometimes")
    with pytest.raises(ConfigError):  # replicas must share the layout: a repair copies records
        FarmConfig((ClusterConfig.of("redis://127.0.0.1:1"), ClusterConfig.of("redis://127.0.0.1:2", prefix="x:")))
