"""The one error tree: every error zcluster raises on purpose derives from :class:`ZClusterError`.

Errors that also have a natural built-in meaning keep it as a second base (a bad URL is also a
``ValueError``, a missing journal also a ``LookupError``), so ``except ValueError`` keeps working. The
classes of this module are the core's; each layer above defines its own in the module named beside it,
still under this root (``zcluster.message`` has its own sub-root, :class:`MessageError`, so that the
message layer stays free of everything Redis-specific). A test walks every module and checks that this
drawing is true::

    ZClusterError
    ├── ConfigError                  (ValueError) a bad URL, prefix or option; nothing was done
    ├── InvalidTupleError            (ValueError) a bad tuple or key; nothing of the call was sent
    ├── ShardError                   some shards failed; ``failures`` names each (host:port) and why
    │   ├── PartialWriteError        writes: ``result`` says which tuples took effect, which are unknown
    │   ├── PartialReadError         reads: ``results`` holds the answers, ``errors`` the unanswered items
    │   └── PartialScanError         keys(): the failed shards, after every reachable shard was scanned
    ├── RedirectLoopError            a Redis Cluster kept redirecting one command (a shard's failure)
    ├── InconsistentDataError        the server holds what the 2P-set layout forbids (a foreign write)
    ├── MessageError                 zcluster.message.errors: the message layer's root
    │   ├── FramingError             bytes [begin, end) did not decode into a frame
    │   │   ├── DecodeError          a complete frame with malformed content
    │   │   ├── DesyncError          bytes that are not a frame were skipped
    │   │   └── UnexpectedEndError   the stream ended inside a frame
    │   ├── UnknownContentTypeError  (LookupError) no framing for a content type
    │   ├── SelectorError            (ValueError) a label selector does not parse
    │   ├── EmptyPartitionsError     (LookupError) a mapping found no journal
    │   ├── JournalError             a journal operation failed
    │   │   ├── JournalNotFoundError (LookupError)
    │   │   ├── OffsetOutOfRangeError (ValueError)
    │   │   └── JournalExistsError   (ValueError) zcluster.journal.store
    │   └── SequencerError           the Sequencer was used out of order, or its replay failed
    │       ├── ReplayRequiredError  step() after ACK_COMMIT_REPLAY without start_replay()
    │       └── ReplayError          the replay iterator failed or left its range
    ├── UndecodableMessageError      (ValueError) zcluster.channels.typed: a message not of its registered type
    │   └── UnknownKindError         its (group, kind) is not registered
    ├── NoHandlerError               (LookupError) zcluster.channels.dispatch: a command nobody handles
    ├── MapperError                  zcluster.state.applier: the mapper raised; nothing was checkpointed
    ├── ServerNotFound               zcluster.testing.servers: no redis-server/valkey-server binary
    └── TlsUnsupported               zcluster.testing.servers: the binary was built without TLS

What an error means for the data: :class:`InvalidTupleError` and :class:`ConfigError` are raised before
anything is sent. A :class:`ShardError` means the other shards did their part; what the failed shards
did is unknown, and since every write is idempotent, resending the unconfirmed part is safe (it may be
refused again for the same reason when the cause is permanent, e.g. ``WRONGTYPE``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zcluster.types import ShardFailure, WriteResult


class ZClusterError(Exception):
    """Base class of every error zcluster raises on purpose."""


class ConfigError(ZClusterError, ValueError):
    """A cluster or server configuration is invalid (bad URL, prefix, option); nothing was done."""


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


class InconsistentDataError(ZClusterError):
    """The servers hold what the 2P-set layout forbids (a member both in K+ and K-): a foreign write."""
