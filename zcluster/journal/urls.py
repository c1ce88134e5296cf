"""Opening a journal store from a URL, so Spark executors can reconnect from a picklable string.

Only a Redis URL imports redis-py (file stores work without it loaded)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from zcluster.journal.files import FileJournals
from zcluster.journal.store import JournalStore

__all__ = ["open_store"]


def open_store(url: str) -> JournalStore:
    """``file:///dir`` (or a plain path) for file journals; ``redis://host:port?prefix=p`` for Redis Streams;
    ``redis+cluster://host:port?prefix=p`` for Redis Streams on a Redis Cluster (seed node)."""
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        return FileJournals(parts.path or url)
    if parts.scheme in ("redis", "rediss", "redis+cluster"):
        from zcluster.journal.streams import RedisJournals  # only Redis URLs load a Redis client

        query = parse_qs(parts.query)
        prefix = query.pop("prefix", ["zcj:"])[0]
        cluster = parts.scheme == "redis+cluster"
        base = url.replace("redis+cluster://", "redis://", 1).split("?")[0]
        return RedisJournals.from_url(base, cluster=cluster, prefix=prefix)
    raise ValueError(f"unsupported journal store URL scheme {parts.scheme!r} (file:, redis:, redis+cluster:)")
