"""Write quorums parsed as roshi parses them, and the configuration errors around them."""

from __future__ import annotations

import pytest

from zcluster import Cluster, ConfigError
from zcluster.farm import Farm, FarmConfig, parse_quorum


@pytest.mark.parametrize(
    ("quorum", "replicas", "count"),
    [
        ("51%", 3, 2),
        ("34%", 3, 2),
        ("32%", 3, 1),
        ("33.4%", 3, 2),  # a fraction above a third of three rounds up to 2
        ("50%", 5, 3),
        ("50%", 4, 2),
        ("51%", 4, 3),
        ("100%", 3, 3),
        ("100%", 7, 7),
        ("1%", 3, 1),
        (" 51% ", 3, 2),
        (1, 3, 1),
        (2, 3, 2),
        (3, 3, 3),
        ("100%", 1, 1),
    ],
)
def test_quorum_as_roshi(quorum: str | int, replicas: int, count: int) -> None:
    assert parse_quorum(quorum, replicas) == count


@pytest.mark.parametrize(
    "quorum",
    ["0%", "110%", "100.5%", "abc", "-1%", "+50%", "%", "51", "", "1/0%", "nan%", "inf%", 0, -1, 4, True, 2.0, None],
)
def test_bad_quorums_are_config_errors(quorum: object) -> None:
    with pytest.raises(ConfigError):
        parse_quorum(quorum, 3)  # type: ignore[arg-type]


@pytest.mark.parametrize("replicas", [0, -1, True])
def test_a_farm_needs_replicas(replicas: int) -> None:
    with pytest.raises(ConfigError):
        parse_quorum("51%", replicas)


def test_farm_and_config_validate_the_quorum_before_connecting() -> None:
    # Nothing listens on these ports: a valid config connects lazily, a bad one fails at once.
    urls = ["redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"]
    assert FarmConfig.of(urls).write_quorum == "51%"
    assert FarmConfig.of(urls, write_quorum=3).write_quorum == 3
    with pytest.raises(ConfigError):
        FarmConfig.of(urls, write_quorum="0%")
    with pytest.raises(ConfigError):
        FarmConfig.of(urls, write_quorum=4)
    clusters = [Cluster.from_urls([u]) for u in urls]
    try:
        assert Farm(clusters).quorum == 2
        assert Farm(clusters, write_quorum="100%").quorum == 3
        assert Farm(clusters, write_quorum="32%").quorum == 1
        for bad in ("110%", "abc", 0, 4):
            with pytest.raises(ConfigError):
                Farm(clusters, write_quorum=bad)
        with pytest.raises(ConfigError):
            Farm(clusters, names=["a", "a", "b"])
    finally:
        for c in clusters:
            c.close()
