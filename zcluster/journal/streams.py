"""Redis Streams journals: one stream per journal, on a standalone server or a Redis Cluster.

Why this module is long: one class is the whole store (appends, reads, the lost range retention leaves,
consumer groups, positions), each part a few Redis commands over the same keys.

Layout, for a journal ``name`` under key prefix ``P`` (all of a journal's keys share the hash tag
``{Pname}``, so they live in one Redis Cluster slot and one script can touch them atomically):

* ``{Pname}:s``: the stream. Each non-empty append is one entry whose ID is ``<begin>-1`` (its begin
  byte offset) with one field ``d`` (the bytes), so the entry covers [begin, begin + len(d)) and a
  reader finds the entry holding any offset with one XREVRANGE.
* ``{Pname}:m``: a hash: ``end`` (the end offset), ``labels``, ``metadata`` (JSON), ``uid`` (its identity).
* ``{Pname}:p``: a hash of consumer-group read positions (byte offsets), used by the channels layer.
* ``Pjournals``: a hash of every journal's labels, for ``list(selector)``.

Guarantees: offsets are assigned and the entries added by one Lua script per append call (atomic and
serialised per journal across any number of clients); readers see whole appends only, in order, and
follow new appends (blocking XREAD). Native consumer groups (XREADGROUP, XACK, XAUTOCLAIM) hand out
*entries* (whole appends) to competing consumers, with pending-entry recovery of entries a dead
consumer never acknowledged. Retention: ``retain_bytes`` trims entries that lie wholly before
``end - retain_bytes`` (approximately, as Redis' ``MINID ~``), on every append. The trimmed bytes are
the journal's *lost range* [0, begin of the oldest entry left), as a damaged file journal's
(:meth:`RedisJournals.lost_ranges`): a read reaching it, at its start or because it was trimmed under the
reader, raises OffsetOutOfRangeError naming it (``lost_begin``, ``lost_end``, ``resume_offset``, reason
``trimmed by retention``), so readers' ``failOnDataLoss`` / ``fail_on_data_loss`` and ``skip-lost`` treat
it as on file journals. Durability is Redis' (AOF/RDB settings of the server).
"""

from __future__ import annotations

import builtins
import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlencode, urlsplit

import redis
from redis.cluster import RedisCluster

from zcluster.errors import ConfigError
from zcluster.journal._pieces import LostRange
from zcluster.journal.store import (
    JournalInfo,
    append_results,
    validate_group,
    validate_journal_name,
    validate_labels,
)
from zcluster.message.errors import JournalError, JournalExistsError, JournalNotFoundError, OffsetOutOfRangeError
from zcluster.message.journals import AppendResult, JournalSpec
from zcluster.message.labels import LabelSelector, parse_selector

__all__ = ["ClaimResult", "RedisJournals", "StreamEntry"]

RedisClient = redis.Redis | RedisCluster

_TRIMMED = "trimmed by retention"

_APPEND = """
local e = redis.call('HGET', KEYS[2], 'end')
if not e then return redis.error_reply('JOURNALNOTFOUND') end
e = tonumber(e)
local begin = e
for i = 2, #ARGV do
  local d = ARGV[i]
  if #d > 0 then
    redis.call('XADD', KEYS[1], string.format('%d-1', e), 'd', d)
    e = e + #d
  end
end
redis.call('HSET', KEYS[2], 'end', string.format('%d', e))
if ARGV[1] ~= '' and e > tonumber(ARGV[1]) then
  redis.call('XTRIM', KEYS[1], 'MINID', '~', string.format('%d-1', e - tonumber(ARGV[1])))
end
return string.format('%d', begin)
"""

_CREATE = """
if redis.call('HSETNX', KEYS[1], 'end', '0') == 0 then return 0 end
redis.call('HSET', KEYS[1], 'labels', ARGV[1], 'metadata', ARGV[2], 'uid', ARGV[3])
return 1
"""


class StreamEntry(NamedTuple):
    """One append, as a Redis stream entry: its ID and [begin, end) byte range, and its bytes."""

    id: str
    begin: int
    end: int
    data: bytes


class ClaimResult(NamedTuple):
    """Entries taken over from idle consumers, and IDs of pending entries that were trimmed meanwhile."""

    entries: builtins.list[StreamEntry]
    deleted: builtins.list[str]


def _entry(raw_id: bytes, fields: Mapping[bytes, bytes]) -> StreamEntry:
    sid = raw_id.decode()
    begin = int(sid.partition("-")[0])
    data = fields[b"d"]
    return StreamEntry(sid, begin, begin + len(data), data)


class RedisJournals:
    """Journals as Redis streams (see the module docstring), over `client` (``decode_responses=False``).

    Implements the message layer's JournalWriter/JournalReader/JournalLister and
    :class:`zcluster.journal.store.JournalStore`. Safe for concurrent use by threads when the client is.
    Redis errors (connection, timeout) propagate as redis-py exceptions.
    """

    transient_errors: tuple[type[BaseException], ...] = (
        redis.ConnectionError,
        redis.TimeoutError,
        ConnectionError,
        TimeoutError,
    )
    """Network failures and timeouts: the command may or may not have run, and retrying an append is safe
    for read-committed readers (a duplicate is dropped by UUID)."""

    def __init__(
        self,
        client: RedisClient,
        *,
        prefix: str = "",
        retain_bytes: int | None = None,
        read_batch: int = 1024,
        block_slice: float = 1.0,
    ) -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError(f"key prefix {prefix!r} must not contain braces (they would break hash tags)")
        if retain_bytes is not None and retain_bytes < 1:
            raise ValueError("retain_bytes must be positive or None")
        if read_batch < 1 or block_slice <= 0:
            raise ValueError("read_batch and block_slice must be positive")
        self.client = client
        self._r: Any = client  # redis-py's response types are unions over RESP versions; we use RESP2
        self.prefix = prefix
        self._retain = "" if retain_bytes is None else str(retain_bytes)
        self._batch = read_batch
        self._slice_ms = max(1, int(block_slice * 1000))
        self._append = client.register_script(_APPEND)
        self._create = client.register_script(_CREATE)

    @classmethod
    def from_url(cls, url: str, *, cluster: bool = False, **options: Any) -> RedisJournals:
        """Connect to `url` (a Redis Cluster seed node when `cluster`); `options` go to the constructor.

        A ``prefix`` query option is the key prefix (default ``zcj:``); the rest of the URL is read as the
        cluster's URLs are (``zcluster.connect``): a URL that does not parse, or an option redis-py cannot
        take, is a :class:`zcluster.ConfigError` naming it with its password replaced by ``***``.
        """
        from zcluster._urls import client_from_url, redact, safe_name

        name = safe_name(url)  # a URL that does not parse is refused here, redacted
        parts = urlsplit(url)
        query = parse_qs(parts.query, keep_blank_values=True)
        if "prefix" in query:
            options.setdefault("prefix", query.pop("prefix")[-1])
        base = parts._replace(query=urlencode(query, doseq=True)).geturl()
        if not cluster:
            return cls(client_from_url(base), **options)
        try:
            client: RedisClient = RedisCluster.from_url(base)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"invalid Redis Cluster URL for {name}: {redact(str(exc), [url])}") from None
        return cls(client, **options)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RedisJournals:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- keys ----------------------------------------------------------------------------------------

    def _tag(self, journal: str) -> str:
        return "{" + self.prefix + validate_journal_name(journal) + "}"

    def stream_key(self, journal: str) -> str:
        """The Redis key of `journal`'s stream."""
        return self._tag(journal) + ":s"

    def _meta(self, journal: str) -> str:
        return self._tag(journal) + ":m"

    def _pos(self, journal: str) -> str:
        return self._tag(journal) + ":p"

    @property
    def _registry(self) -> str:
        return self.prefix + "journals"

    # -- management ----------------------------------------------------------------------------------

    def create(self, spec: JournalSpec, metadata: Mapping[str, str] | None = None) -> None:
        """Create an empty journal. JournalExistsError if it exists; ValueError for bad names or labels."""
        labels = validate_labels(spec.name, spec.labels)
        args = [json.dumps(labels), json.dumps(dict(metadata or {})), uuid.uuid4().hex]
        if not self._create(keys=[self._meta(spec.name)], args=args):
            raise JournalExistsError(f"journal {spec.name!r} already exists (prefix {self.prefix!r})")
        self.client.hset(self._registry, spec.name, json.dumps(labels))

    def destroy(self, journal: str) -> None:
        """Delete the journal's stream, metadata and positions. JournalNotFoundError if unknown."""
        self._require(journal)
        self.client.hdel(self._registry, journal)
        self.client.delete(self.stream_key(journal))
        self.client.delete(self._pos(journal))
        self.client.delete(self._meta(journal))

    def _require(self, journal: str) -> None:
        if not self.client.exists(self._meta(journal)):
            raise JournalNotFoundError(f"journal {journal!r} not found (prefix {self.prefix!r})")

    def info(self, journal: str) -> JournalInfo:
        labels, metadata, uid = self._r.hmget(self._meta(journal), ["labels", "metadata", "uid"])
        if labels is None:
            raise JournalNotFoundError(f"journal {journal!r} not found (prefix {self.prefix!r})")
        return JournalInfo(journal, json.loads(labels), json.loads(metadata or b"{}"), (uid or b"").decode())

    def spec(self, journal: str) -> JournalSpec:
        """The journal's name and labels; JournalNotFoundError if unknown."""
        return self.info(journal).spec

    def update_metadata(self, journal: str, metadata: Mapping[str, str]) -> None:
        """Merge `metadata` into the journal's metadata (read-modify-write: last writer wins per call)."""
        merged = {**self.info(journal).metadata, **metadata}
        self.client.hset(self._meta(journal), "metadata", json.dumps(merged))

    def list(self, selector: LabelSelector | str) -> builtins.list[JournalSpec]:
        sel = parse_selector(selector) if isinstance(selector, str) else selector
        out = []
        for name, labels in self._r.hgetall(self._registry).items():
            parsed = json.loads(labels)
            if sel.matches(parsed):
                out.append(JournalSpec(name.decode(), parsed))
        return sorted(out, key=lambda s: s.name)

    # -- positions -----------------------------------------------------------------------------------

    def load_position(self, journal: str, group: str) -> int | None:
        self._require(journal)
        v = self._r.hget(self._pos(journal), validate_group(group))
        return None if v is None else int(v)

    def store_position(self, journal: str, group: str, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"journal {journal!r}, group {group!r}: negative position {offset}")
        self._require(journal)
        self.client.hset(self._pos(journal), validate_group(group), offset)

    def positions(self, journal: str) -> dict[str, int]:
        """Every group's durable position in `journal`."""
        self._require(journal)
        return {k.decode(): int(v) for k, v in self._r.hgetall(self._pos(journal)).items()}

    # -- writer --------------------------------------------------------------------------------------

    def append(self, journal: str, data: bytes) -> AppendResult:
        """Append `data` as one stream entry, atomically; return its [begin, end) byte range."""
        return self.append_many(journal, (data,))[0]

    def append_many(self, journal: str, items: Sequence[bytes]) -> builtins.list[AppendResult]:
        """Append `items` in order, one entry each (none for an empty item), in one atomic script call;
        return each item's range."""
        keys = [self.stream_key(journal), self._meta(journal)]
        try:
            begin = self._append(keys=keys, args=[self._retain, *items])
        except redis.ResponseError as exc:
            if "JOURNALNOTFOUND" in str(exc):
                raise JournalNotFoundError(f"journal {journal!r} not found (prefix {self.prefix!r})") from None
            raise
        return append_results(int(begin), items)

    def end(self, journal: str) -> int:
        v = self._r.hget(self._meta(journal), "end")
        if v is None:
            raise JournalNotFoundError(f"journal {journal!r} not found (prefix {self.prefix!r})")
        return int(v)

    def trim(self, journal: str, before: int) -> int:
        """Remove the entries lying wholly before offset `before` (exactly); return how many were removed."""
        self._require(journal)
        first = self._entry_at(journal, before)
        minid = first.id if first is not None else f"{max(before, 0)}-1"
        return int(self.client.xtrim(self.stream_key(journal), minid=minid, approximate=False))

    # -- reader --------------------------------------------------------------------------------------

    def _entry_at(self, journal: str, offset: int) -> StreamEntry | None:
        """The entry holding byte `offset` (the last entry beginning at or before it), if any."""
        got = self._r.xrevrange(self.stream_key(journal), max=f"{offset}-1", count=1)
        return _entry(*got[0]) if got else None

    def read(
        self, journal: str, offset: int, *, block: bool = False, timeout: float | None = None
    ) -> Iterator[tuple[int, bytes]]:
        """The message layer's JournalReader.read over the journal's entries.

        Raises JournalNotFoundError for an unknown journal and OffsetOutOfRangeError if `offset` is
        negative, past the end, or trimmed away by retention.
        """
        end = self.end(journal)
        if offset < 0 or offset > end:
            raise OffsetOutOfRangeError(f"journal {journal!r}: offset {offset} outside [0, {end}]")
        first = self._entry_at(journal, offset)
        if offset < end and (first is None or first.end <= offset):
            trimmed = self._trimmed(journal, end)
            if trimmed is not None and offset < trimmed.end:
                raise self._trimmed_error(journal, trimmed)
        return self._read(journal, offset, first, block, timeout)

    def lost_ranges(self, journal: str) -> builtins.list[LostRange]:
        """The journal's lost range, if retention trimmed any of it: [0, begin of the oldest entry left)
        (the module docstring says how readers meet it). JournalNotFoundError for an unknown journal."""
        trimmed = self._trimmed(journal, self.end(journal))
        return [] if trimmed is None else [trimmed]

    def _trimmed(self, journal: str, end: int) -> LostRange | None:
        oldest = self._r.xrange(self.stream_key(journal), count=1)
        first = _entry(*oldest[0]).begin if oldest else end  # none left: every byte up to the end was trimmed
        return LostRange(0, first, _TRIMMED) if first > 0 else None

    def _trimmed_error(self, journal: str, r: LostRange) -> OffsetOutOfRangeError:
        return OffsetOutOfRangeError(
            f"journal {journal!r}: bytes {r.begin}..{r.end} were lost ({r.reason}); "
            f"reading can go on at offset {r.end}",
            journal=journal,
            lost_begin=r.begin,
            lost_end=r.end,
            resume_offset=r.end,
            reason=r.reason,
        )

    def _read(
        self, journal: str, pos: int, first: StreamEntry | None, block: bool, timeout: float | None
    ) -> Iterator[tuple[int, bytes]]:
        key = self.stream_key(journal)
        last = f"{pos}-0"
        if first is not None and first.end > pos:
            yield pos, first.data[pos - first.begin :]
            pos, last = first.end, first.id
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            got = self._r.xrange(key, min="(" + last, count=self._batch)
            if not got and block:
                wait = self._slice_ms
                if deadline is not None:
                    wait = min(wait, int((deadline - time.monotonic()) * 1000))
                    if wait <= 0:
                        return
                res = self._r.xread({key: last}, count=self._batch, block=max(wait, 1))
                got = res[0][1] if res else []
            if not got:
                if not block:
                    return
                continue
            for raw_id, fields in got:
                e = _entry(raw_id, fields)
                if e.begin != pos:
                    trimmed = self._trimmed(journal, self.end(journal))
                    if trimmed is not None and pos < trimmed.end:  # trimmed under the reader
                        raise self._trimmed_error(journal, trimmed)
                    where = f"expected an entry at offset {pos}, found {e.id}"
                    raise JournalError(f"journal {journal!r}: {where}")
                yield e.begin, e.data
                pos, last = e.end, e.id
            if timeout is not None:
                deadline = time.monotonic() + timeout

    # -- native consumer groups ----------------------------------------------------------------------

    def group_create(self, journal: str, group: str, *, offset: int = 0) -> bool:
        """Create consumer group `group` on `journal`'s stream, delivering entries beginning at or after
        `offset`. Returns False if the group already exists (its position is left unchanged)."""
        self._require(journal)
        try:
            self.client.xgroup_create(self.stream_key(journal), validate_group(group), id=f"{offset}-0")
        except redis.ResponseError as exc:
            if "BUSYGROUP" in str(exc):
                return False
            raise
        return True

    def group_read(
        self, journal: str, group: str, consumer: str, *, count: int = 100, block: float | None = None
    ) -> builtins.list[StreamEntry]:
        """Up to `count` entries never delivered to `group` (XREADGROUP ``>``), now pending for `consumer`
        until acknowledged. `block`: seconds to wait for entries (None: do not wait)."""
        res = self._r.xreadgroup(
            group,
            consumer,
            {self.stream_key(journal): ">"},
            count=count,
            block=None if block is None else max(1, int(block * 1000)),
        )
        return [_entry(i, f) for i, f in res[0][1]] if res else []

    def group_ack(self, journal: str, group: str, ids: Sequence[str]) -> int:
        """Acknowledge entries of `group` (XACK); return how many were pending."""
        return int(self.client.xack(self.stream_key(journal), group, *ids)) if ids else 0

    def group_pending(self, journal: str, group: str) -> dict[str, int]:
        """Pending (delivered, unacknowledged) entry counts per consumer of `group`."""
        info = self._r.xpending(self.stream_key(journal), group)
        return {c["name"].decode(): int(c["pending"]) for c in info["consumers"]}

    def group_claim(self, journal: str, group: str, consumer: str, *, min_idle: float, count: int = 100) -> ClaimResult:
        """Take over entries pending for longer than `min_idle` seconds (their consumer presumably died)
        for `consumer` (XAUTOCLAIM, scanning the whole pending list). Trimmed entries are returned in
        ``deleted`` and dropped from the pending list by Redis."""
        key, start = self.stream_key(journal), "0-0"
        entries: builtins.list[StreamEntry] = []
        deleted: builtins.list[str] = []
        while len(entries) < count:
            nxt, got, gone = self._r.xautoclaim(
                key, group, consumer, int(min_idle * 1000), start_id=start, count=count - len(entries)
            )
            entries.extend(_entry(i, f) for i, f in got if f)
            deleted.extend(d.decode() for d in gone)
            start = nxt.decode() if isinstance(nxt, bytes) else str(nxt)
            if start == "0-0":
                break
        return ClaimResult(entries, deleted)
