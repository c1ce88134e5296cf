"""Key layout (hash tags) and routing: roshi's murmur3, jump hashing's minimal movement, real slots."""

from __future__ import annotations

import random

import pytest
import redis

from zcluster import ConfigError
from zcluster._keys import KeyLayout
from zcluster._topology import StandaloneTopology, jump_hash, murmur3
from zcluster._urls import safe_name


def test_murmur3_matches_roshi_vector() -> None:
    assert murmur3(b"hello") == 0x248BFA47


@pytest.mark.parametrize("key", [b"", b"plain", b"}", b"}x", b"a}b", b"{x}", b"{", b"a{b}c}", b"\xff\x00"])
def test_all_three_redis_keys_share_a_slot(key: bytes) -> None:
    layout = KeyLayout("app:")
    slots = {redis.cluster.key_slot(k) for k in (layout.adds(key), layout.removes(key), layout.floor(key))}
    assert slots == {layout.slot(key)}


def test_layout_round_trips_logical_keys() -> None:
    layout = KeyLayout("ns:")
    for key in (b"a", b"}x{", b"\xff"):
        assert layout.logical(layout.adds(key)) == (key, b"}+")
        assert layout.logical(layout.removes(key)) == (key, b"}-")
    assert layout.logical(b"{other:a}+") is None
    assert layout.logical(b"{ns:a}x") is None


@pytest.mark.parametrize("prefix", ["", "a{b", "a}b"])
def test_bad_prefixes_are_rejected(prefix: str) -> None:
    with pytest.raises(ConfigError, match="prefix"):
        KeyLayout(prefix)


def test_scan_pattern_escapes_glob_characters() -> None:
    assert KeyLayout("a*b:").scan_pattern(None, False) == b"{a\\*b:*}+"
    assert KeyLayout("x:").scan_pattern(b"user:*", True) == b"{x:user:*}[+-]"


def test_jump_hash_moves_about_one_nth_of_keys_when_a_shard_is_added() -> None:
    rng = random.Random(7)
    layout = KeyLayout("zc:")
    keys = [f"user:{rng.getrandbits(48)}".encode() for _ in range(20000)]
    for n in (2, 4, 8):
        before = StandaloneTopology([f"redis://127.0.0.1:{7000 + i}" for i in range(n)])
        after = StandaloneTopology([f"redis://127.0.0.1:{7000 + i}" for i in range(n + 1)])
        moved = sum(before.shard_of(k, layout.slot(k)) != after.shard_of(k, layout.slot(k)) for k in keys)
        fraction = moved / len(keys)
        # ideal is 1/(n+1); modulo hashing would move n/(n+1)
        assert abs(fraction - 1 / (n + 1)) < 0.03, (n, fraction)
        # every moved key moved to the new shard
        assert all(
            after.shard_of(k, layout.slot(k)) == n
            for k in keys
            if before.shard_of(k, layout.slot(k)) != after.shard_of(k, layout.slot(k))
        )


def test_roshi_routing_is_murmur_modulo() -> None:
    topo = StandaloneTopology(["redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"], "roshi")
    assert topo.shard_of(b"hello", 0) == 0x248BFA47 % 3


def test_jump_hash_is_balanced() -> None:
    counts = [0] * 5
    for slot in range(16384):
        counts[jump_hash(slot, 5)] += 1
    assert max(counts) - min(counts) < 16384 * 0.05


def test_safe_name_drops_credentials() -> None:
    assert safe_name("redis://user:s3cret@10.1.2.3:6380/0") == "10.1.2.3:6380"
    with pytest.raises(ConfigError, match="scheme"):
        safe_name("http://x")
