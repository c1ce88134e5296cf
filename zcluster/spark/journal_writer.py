"""``writeStream.format("zcluster-journal")``: a streaming DataFrame's rows into journals, exactly once per
micro-batch (Gazette's transactions, with the batch as the transaction).

Rows need ``journal`` (the journal's name) and ``message`` (a JSON object, as a string) columns; each row
becomes one message of that journal (JSON-framed journals: ``application/x-ndjson``), its ``UUID`` set by
the writer. Options: ``journals`` (the journal store URL), ``app`` (the application id keying what the writer
keeps in the cluster), the cluster's (``urls`` or ``cluster_url``, ``prefix``), and Spark's own
``checkpointLocation``.

Where the transaction begins and ends: each task attempt publishes its rows uncommitted (CONTINUE_TXN) under
a producer id of its own and returns the ACK intents that would commit them, without appending them. The
driver's ``commit(batchId)`` is the commit point: it inserts one record, scored by the batch id, holding every
task's intents (``<app>/published/<checkpoint>`` in the state namespace), then appends the intents. So:

* a failed or speculative task attempt: Spark hands ``commit`` the messages of one successful attempt per
  partition; the other attempts' messages are never acknowledged, so never readable read-committed;
* a batch Spark runs again (a driver that died in ``commit``, before its commit log): ``commit`` finds the
  batch's record and appends its intents again (delivering any a crash lost; a duplicate ACK changes nothing)
  and never the new attempt's, whose messages stay uncommitted;
* an aborted batch: nothing is acknowledged (``abort`` appends nothing); its messages stay uncommitted;
* a new checkpoint directory is a new query (the record key names the ``checkpointLocation``): what its source
  delivers again is published again, as by any sink.

Rolled-back and never-acknowledged messages take journal space until the journal's retention removes them,
and a reader's producer state until its ``prune_horizon`` (each task attempt is a producer). One driver per
checkpoint location at a time (Spark's own rule): two drivers committing one batch id are not fenced.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage

from zcluster.errors import ConfigError
from zcluster.journal.store import CONTENT_TYPE_LABEL, JournalStore, close_store
from zcluster.journal.urls import open_store
from zcluster.message.framing import Framing, JsonFraming, framing_for
from zcluster.message.producer import AckIntent, Producer
from zcluster.message.records import JsonMessage
from zcluster.spark.options import config_from_options
from zcluster.state.store import StateStore
from zcluster.types import KeyScoreMember

__all__ = ["JournalStreamWriter", "Published"]

_CHUNK = 4096  # messages a task queues before appending them (uncommitted: any time before the commit)


@dataclass
class Published(WriterCommitMessage):
    """Per task attempt: its ACK intents (``(journal, frame)``) and how many messages it published."""

    intents: list[tuple[str, bytes]]
    messages: int


def _option(options: dict[str, str], name: str) -> str:
    value = {k.lower(): v for k, v in options.items()}.get(name.lower())
    if not value:
        raise ConfigError(f"writeStream.format('zcluster-journal') needs the {name!r} option")
    return value


class JournalStreamWriter(DataSourceStreamWriter):
    """The writer (see the module)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.journals = _option(options, "journals")
        self.app = _option(options, "app")
        where = _option(options, "checkpointLocation")
        self.progress = hashlib.sha256(where.encode()).hexdigest()[:16]
        self.config = config_from_options(options)

    def write(self, iterator: Iterator[Any]) -> Published:
        """Publish the task's rows uncommitted under a producer of its own; return the intents."""
        store = open_store(self.journals)
        producer = Producer()
        producer.update_clock()
        framings: dict[str, Framing] = {}
        queued: dict[str, list[bytes]] = {}
        count = 0
        try:
            for row in iterator:
                journal, text = row["journal"], row["message"]
                framing = framings.get(journal) or framings.setdefault(journal, _framing(store, journal))
                doc = json.loads(text)
                if not isinstance(doc, dict):
                    raise ConfigError(f"journal {journal}: a row's message must be a JSON object, got {text[:80]!r}")
                message = JsonMessage(doc)
                producer.stamp_uncommitted(message, journal, framing)
                queued.setdefault(journal, []).append(framing.marshal(message))
                count += 1
                if count % _CHUNK == 0:
                    _append(store, queued)
            _append(store, queued)
        finally:
            close_store(store)
        return Published([(i.journal, i.intent) for i in producer.commit_intents()], count)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Record the batch's intents (the commit point), then append them; a batch recorded already: append
        its recorded intents again, never the new attempt's."""
        intents = [AckIntent(j, data) for m in messages if isinstance(m, Published) for j, data in m.intents]
        state = StateStore(self.config.shared(), self.app)
        key = f"{self.app}/published/{self.progress}"
        held = state.cluster.select([key], limit=1_000_000)[key]
        recorded = [r for r in held if r.score == float(batchId)]
        if recorded:
            intents = _decode(str(recorded[0].member))
        elif held and max(r.score for r in held) > batchId:
            raise ConfigError(
                f"application {self.app}: batch {batchId} is older than the last batch recorded for this "
                f"checkpoint location ({max(r.score for r in held):.0f}); nothing of it is committed"
            )
        else:
            state.cluster.insert([KeyScoreMember(key, float(batchId), _encode(intents))])
            if batchId >= 1:
                state.cluster.forget([key], float(batchId - 1))  # one record kept: the last batch's
        store = open_store(self.journals)
        try:
            for journal, data in intents:
                store.append(journal, data)
        finally:
            close_store(store)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing is acknowledged: the batch's messages stay uncommitted, never readable read-committed."""


def _framing(store: JournalStore, journal: str) -> Framing:
    framing = framing_for(store.info(journal).labels[CONTENT_TYPE_LABEL])
    if not isinstance(framing, JsonFraming):
        raise ConfigError(f"journal {journal}: the zcluster-journal writer writes JSON-framed journals only")
    return framing


def _append(store: JournalStore, queued: dict[str, list[bytes]]) -> None:
    for journal, frames in queued.items():
        if frames:
            store.append_many(journal, frames)
    queued.clear()


def _encode(intents: list[AckIntent]) -> str:
    return json.dumps([[i.journal, base64.b64encode(i.intent).decode()] for i in intents])


def _decode(member: str) -> list[AckIntent]:
    return [AckIntent(j, base64.b64decode(data)) for j, data in json.loads(member)]
