"""Typed messages, the dispatcher and the worker pool over real journals."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from zcluster import NoHandlerError, UndecodableMessageError, UnknownKindError
from zcluster.channels import Channels, Context, Dispatcher, KindRegistry, TypedReader, WorkerPool
from zcluster.journal import JournalStore
from zcluster.message import JsonMessage, Publisher, ReadCommittedIter, ReadUncommittedIter, Sequencer

NDJSON = "application/x-ndjson"


def registry() -> tuple[KindRegistry, type, type]:
    reg = KindRegistry()

    @reg.command("orders")
    @dataclass
    class PlaceOrder:
        order: int

    @reg.event("orders")
    @dataclass
    class OrderPlaced:
        order: int

    return reg, PlaceOrder, OrderPlaced


WAIT = 120.0  # bound of a wait on the pool's state: only a broken pool reaches it, never a slow machine


def until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not done():
        assert time.monotonic() < deadline, f"{what}: not after {WAIT:g} s"
        time.sleep(0.01)


def to(name: str):  # type: ignore[no-untyped-def]
    return lambda m: (name, NDJSON)


def test_marshaller_records_the_kind_and_reader_rebuilds_the_type(store: JournalStore) -> None:
    reg, PlaceOrder, OrderPlaced = registry()
    ch = Channels(store)
    ch.create_channels(["c"], topic="t")
    unknown = JsonMessage({"group": "orders", "kind": "Cancelled", "payload": {}})
    bad = JsonMessage({"group": "orders", "kind": "OrderPlaced", "payload": {"nope": 1}})
    ch.produce([reg.wrap(PlaceOrder(1)), unknown, bad, reg.wrap(OrderPlaced(2))], to("c"))
    reader = TypedReader(ReadUncommittedIter(store, store.info("c").spec, decode=reg.decode))
    first = next(reader)
    assert first.message.body == PlaceOrder(1) and str(first.message.kind) == "orders/PlaceOrder"
    with pytest.raises(UnknownKindError, match="orders/Cancelled") as exc:
        next(reader)
    assert exc.value.envelope.begin == first.end and exc.value.envelope.uuid == unknown.get_uuid()
    with pytest.raises(UndecodableMessageError, match="does not fit"):
        next(reader)
    assert next(reader).message.body == OrderPlaced(2)  # the stream goes on
    with pytest.raises(StopIteration):
        next(reader)


def test_registry_rejects_duplicates_and_unserialisable_types() -> None:
    reg, PlaceOrder, _ = registry()
    with pytest.raises(ValueError, match="already registered"):
        reg.register("orders", "PlaceOrder", dataclass(type("Other", (), {})))
    with pytest.raises(ValueError, match="already registered as kind"):
        reg.register("orders", "Again", PlaceOrder)
    with pytest.raises(TypeError, match="dataclass"):
        reg.register("x", "y", object)
    with pytest.raises(LookupError, match="not a registered"):
        reg.wrap(object())


def test_dispatcher_runs_handlers_in_order_and_publishes_followups_after_success(store: JournalStore) -> None:
    reg, PlaceOrder, OrderPlaced = registry()
    published: list[object] = []
    calls: list[str] = []
    d = Dispatcher(reg, publish=published.append)

    def place(ctx: Context) -> None:
        calls.append(f"cmd{ctx.message.order}")
        ctx.publish(OrderPlaced(ctx.message.order))

    d.on_command(PlaceOrder, place)
    d.on_event(OrderPlaced, lambda ctx: calls.append("specific"))
    d.on_all_events(lambda ctx: calls.append(f"all:{ctx.kind}"))
    with pytest.raises(ValueError, match="already has a handler"):
        d.on_command(PlaceOrder, place)
    with pytest.raises(ValueError, match="is an event"):
        d.on_command(OrderPlaced, place)
    ch = Channels(store)
    ch.create_channels(["c"], topic="t")
    ch.produce([reg.wrap(PlaceOrder(7)), reg.wrap(OrderPlaced(7))], to("c"))
    envs = list(ReadUncommittedIter(store, store.info("c").spec, decode=reg.decode))
    assert [d.dispatch(e) for e in envs] == [1, 2]
    assert calls == ["cmd7", "specific", "all:orders/OrderPlaced"]
    assert published == [OrderPlaced(7)]

    failing = Dispatcher(reg, publish=published.append)
    failing.on_command(PlaceOrder, lambda ctx: (ctx.publish(OrderPlaced(0)), 1 / 0))  # type: ignore[func-returns-value]
    with pytest.raises(ZeroDivisionError):
        failing.dispatch(envs[0])
    assert published == [OrderPlaced(7)]  # nothing published by a failed attempt
    with pytest.raises(NoHandlerError):
        Dispatcher(reg).dispatch(envs[0])


def test_worker_pool_retries_then_dead_letters_and_acknowledges(store: JournalStore) -> None:
    reg, PlaceOrder, _ = registry()
    ch = Channels(store, decode=reg.decode)
    names = [f"w/{i}" for i in range(3)]
    ch.create_channels(names, topic="w")
    ch.create_channels(["dlq"], topic="dead")
    attempts: dict[int, int] = {}
    done: list[int] = []
    lock = threading.Lock()

    def handle(ctx: Context) -> None:
        with lock:
            attempts[ctx.message.order] = attempts.get(ctx.message.order, 0) + 1
        if ctx.message.order == 13 or (ctx.message.order == 5 and ctx.attempt < 2):
            raise RuntimeError(f"cannot place {ctx.message.order}")
        with lock:
            done.append(ctx.message.order)

    d = Dispatcher(reg)
    d.on_command(PlaceOrder, handle)
    for i in range(30):
        ch.produce([reg.wrap(PlaceOrder(i))], to(names[i % 3]))
    ch.produce([JsonMessage({"group": "orders", "kind": "Unknown", "payload": {}})], to(names[0]))
    pool = WorkerPool(ch, "g", names, d, dead_letter="dlq", workers=2, max_attempts=3, poll_interval=0.01)
    with pool:
        until(lambda: pool.handled + pool.dead_lettered == 31, "31 messages handled or dead-lettered")
    assert pool.errors == []
    assert sorted(done) == [i for i in range(30) if i != 13]
    assert attempts[13] == 3 and attempts[5] == 2
    for n in names:
        assert ch.position("g", n) == store.end(n)
    dead = [json.loads(line) for line in b"".join(c for _, c in store.read("dlq", 0)).splitlines()]
    assert len(dead) == 2
    assert {d["attempts"] for d in dead} == {3, 1}
    assert any("Unknown" in d["error"] for d in dead)
    frames = [json.loads(base64.b64decode(d["frame"])) for d in dead]
    assert sorted(f["payload"].get("order", -1) for f in frames) == [-1, 13]


def test_graceful_shutdown_leaves_unstarted_messages_unacknowledged(store: JournalStore) -> None:
    reg, PlaceOrder, _ = registry()
    ch = Channels(store, decode=reg.decode)
    ch.create_channels(["c"], topic="t")
    ch.create_channels(["dlq"], topic="dead")
    res = ch.produce([reg.wrap(PlaceOrder(i)) for i in range(10)], to("c"))
    started = threading.Event()
    release = threading.Event()
    seen: list[int] = []

    def slow(ctx: Context) -> None:
        seen.append(ctx.message.order)
        started.set()
        release.wait(WAIT)

    d = Dispatcher(reg)
    d.on_command(PlaceOrder, slow)
    pool = WorkerPool(ch, "g", ["c"], d, dead_letter="dlq", workers=1).start()
    assert started.wait(WAIT)
    pool.stop()
    release.set()
    assert pool.join(WAIT)
    assert seen == [0] and pool.handled == 1
    assert ch.position("g", "c") == res[0].end  # the message in hand finished and was acknowledged
    assert [e.message.body.order for e in Channels(store, decode=reg.decode).consume("g", "c", 100)] == list(
        range(1, 10)
    )


def test_worker_pool_dead_letters_records_without_a_kind_and_skips_transaction_acks(store: JournalStore) -> None:
    """A record that names no kind is dead-lettered (logged, counted as a dead letter, never as handled),
    whether or not it has a UUID; a transaction's ACK is acknowledged without dispatch and counted apart."""
    reg, _, OrderPlaced = registry()
    ch = Channels(store, decode=reg.decode)
    ch.create_channels(["c"], topic="t")
    ch.create_channels(["dlq"], topic="dead")
    ch.produce([reg.wrap(OrderPlaced(1))], to("c"))
    ch.produce([JsonMessage({"note": "no kind here"})], to("c"))  # stamped UUID, no group or kind
    store.append("c", b"{}\n")  # no group, kind or UUID at all
    ch.produce([JsonMessage({"group": "orders", "payload": {"order": 9}})], to("c"))  # a group but no kind
    txn = Publisher(store)
    txn.publish_uncommitted(to("c"), reg.wrap(OrderPlaced(2)))
    txn.append_ack_intents(txn.build_ack_intents())  # an ACK: {"UUID": ...} with ACK_TXN flags
    ch.produce([reg.wrap(OrderPlaced(3))], to("c"))
    seen: list[int] = []
    d = Dispatcher(reg)
    d.on_event(OrderPlaced, lambda ctx: seen.append(ctx.message.order))
    pool = WorkerPool(ch, "g", ["c"], d, dead_letter="dlq", workers=1, poll_interval=0.01)
    with pool:
        until(lambda: ch.position("g", "c") == store.end("c"), "the pool acknowledged everything")
    assert pool.errors == []
    assert seen == [1, 2, 3]
    assert (pool.handled, pool.dead_lettered, pool.acks) == (3, 3, 1)
    dead = [json.loads(line) for line in b"".join(c for _, c in store.read("dlq", 0)).splitlines()]
    frames = [json.loads(base64.b64decode(x["frame"])) for x in dead]
    assert [{k: v for k, v in f.items() if k != "UUID"} for f in frames] == [
        {"note": "no kind here"},
        {},
        {"group": "orders", "payload": {"order": 9}},
    ]
    assert all("names no message kind" in x["error"] and x["attempts"] == 1 for x in dead)
    assert dead[1]["uuid"] == "0" * 32 and dead[0]["uuid"] != "0" * 32  # no UUID reads as the all-zero one


def test_typed_reader_raises_for_a_record_without_a_kind_and_skips_acks(store: JournalStore) -> None:
    reg, _, OrderPlaced = registry()
    ch = Channels(store)
    ch.create_channels(["c"], topic="t")
    txn = Publisher(store)
    txn.publish_uncommitted(to("c"), reg.wrap(OrderPlaced(1)))
    txn.append_ack_intents(txn.build_ack_intents())
    store.append("c", b'{"payload": {"order": 2}}\n')
    ch.produce([reg.wrap(OrderPlaced(3))], to("c"))
    reader = TypedReader(ReadCommittedIter(store, store.info("c").spec, Sequencer(), decode=reg.decode))
    assert next(reader).message.body == OrderPlaced(1)  # the ACK after it is skipped
    with pytest.raises(UndecodableMessageError, match="names no message kind"):
        next(reader)
    assert next(reader).message.body == OrderPlaced(3)


def test_channel_errors_are_importable_from_zcluster_channels_as_the_same_classes() -> None:
    import zcluster
    import zcluster.channels as channels

    for name in ["UndecodableMessageError", "UnknownKindError", "NoHandlerError"]:
        assert name in channels.__all__
        assert getattr(channels, name) is getattr(zcluster, name) is getattr(zcluster.errors, name)
