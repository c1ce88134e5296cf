"""How a logical set is laid out in Redis keys.

A logical key K under namespace prefix P is stored as three Redis keys that share one hash tag::

    {P K}+   the add set K+ (a sorted set)
    {P K}-   the remove set K- (a sorted set of tombstones)
    {P K}~   the floor (a string; only with floors, which a size bound implies, once something was
             trimmed or forgotten: see Cluster.forget)

Redis Cluster hashes the text between the first ``{`` and the first ``}`` after it. P is non-empty and has
no braces, so that text is ``P`` followed by K up to its first ``}``: never empty, and the same for the
three keys, whatever K holds (braces, nothing at all, raw bytes). Standalone shards use the same layout,
so data can move between topologies.
"""

from __future__ import annotations

from binascii import crc_hqx
from typing import Final

from zcluster.errors import ConfigError
from zcluster.types import Blob, to_bytes

# Final: compiled (zcluster._native), each is a C static, where a module global is a dict lookup at each use.
SLOTS: Final = 16384
ADD: Final = b"}+"
REMOVE: Final = b"}-"
FLOOR: Final = b"}~"
_GLOB_SPECIAL = frozenset(b"*?[]\\")


def glob_escape(raw: bytes) -> bytes:
    """Escape Redis glob metacharacters so ``raw`` matches only itself in SCAN MATCH."""
    return b"".join(b"\\" + bytes([c]) if c in _GLOB_SPECIAL else bytes([c]) for c in raw)


class KeyLayout:
    """Maps logical keys to Redis keys and hash slots for one namespace prefix."""

    __slots__ = ("head", "prefix")

    def __init__(self, prefix: Blob = "zc:") -> None:
        raw = to_bytes(prefix)
        if not raw:
            raise ConfigError("prefix must be non-empty: it keeps the cluster hash tag of every key non-empty")
        if b"{" in raw or b"}" in raw:
            raise ConfigError(f"prefix {prefix!r} must not contain braces: they would change the hash tag")
        self.prefix = raw
        self.head = b"{" + raw

    def adds(self, key: bytes) -> bytes:
        return self.head + key + ADD

    def removes(self, key: bytes) -> bytes:
        return self.head + key + REMOVE

    def floor(self, key: bytes) -> bytes:
        return self.head + key + FLOOR

    def script_keys(self, key: bytes, floors: bool) -> tuple[bytes, ...]:
        """The KEYS a write-script call passes for ``key``: K+, K- and, with floors, the floor."""
        base = self.head + key
        return (base + ADD, base + REMOVE, base + FLOOR) if floors else (base + ADD, base + REMOVE)

    def slot(self, key: bytes) -> int:
        """The Redis Cluster hash slot of every Redis key of logical key ``key``."""
        tag = self.prefix + key
        end = tag.find(b"}")
        return crc_hqx(tag if end < 0 else tag[:end], 0) & (SLOTS - 1)

    def logical(self, redis_key: bytes) -> tuple[bytes, bytes] | None:
        """Split a Redis key into (logical key, suffix), or None if it is not one of this namespace's."""
        if not redis_key.startswith(self.head) or len(redis_key) < len(self.head) + 2:
            return None
        suffix = redis_key[-2:]
        if suffix not in (ADD, REMOVE, FLOOR):
            return None
        return redis_key[len(self.head) : -2], suffix

    def scan_pattern(self, match: bytes | None, include_removed: bool) -> bytes:
        """SCAN MATCH pattern for this namespace's K+ keys (and K- keys with ``include_removed``)."""
        body = match if match is not None else b"*"
        return b"{" + glob_escape(self.prefix) + body + (b"}[+-]" if include_removed else b"}+")
