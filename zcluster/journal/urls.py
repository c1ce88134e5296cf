"""Opening a journal store from a URL, so Spark executors can reconnect from a picklable string.

Only a Redis URL imports redis-py (file stores work without it loaded)."""

from __future__ import annotations

from urllib.parse import urlsplit

from zcluster.journal.files import FileJournals
from zcluster.journal.store import JournalStore

__all__ = ["open_store"]


def open_store(url: str, *, recover: bool = True, create: bool = True) -> JournalStore:
    """``file:///dir`` (or a plain path) for file journals; ``redis://host:port?prefix=p`` for Redis Streams;
    ``redis+cluster://host:port?prefix=p`` for Redis Streams on a Redis Cluster (seed node).

    ``recover=False`` opens file journals without recovering them: recovery scans every journal under the
    root and takes their append locks, which a reader of ranges planned elsewhere (a Spark task) need not
    pay; :func:`zcluster.journal.frames.read_range` recovers the one journal it reads if it reads short.
    ``create=False`` creates no directory: a missing root raises JournalNotFoundError (read-only views)."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme in ("redis", "rediss", "redis+cluster"):
        from zcluster.journal.streams import RedisJournals  # only Redis URLs load a Redis client

        cluster = scheme == "redis+cluster"
        # Parsed (and refused, password redacted) by the same code as the cluster's URLs.
        return RedisJournals.from_url(f"redis://{rest}" if cluster else url, cluster=cluster)
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        return FileJournals(parts.path or url, recover=recover, create=create)
    raise ValueError(f"unsupported journal store URL scheme {parts.scheme!r} (file:, redis:, redis+cluster:)")
