from __future__ import annotations

from typing import Any

import pytest

from zcluster.journal import AsyncPublisher, FileJournals
from zcluster.message import (
    EmptyPartitionsError,
    InMemoryJournals,
    JournalSpec,
    JsonMessage,
    LabelSelector,
    SelectorError,
    fnv1a32,
    modulo_mapping,
    parse_selector,
    partitions_from,
    random_mapping,
    rendezvous_mapping,
)

NDJSON = {"content-type": "application/x-ndjson"}


def fixture(count: int) -> list[JournalSpec]:
    return [JournalSpec(f"a/topic/part-{i:03d}", NDJSON) for i in range(count)]


KEYS = [
    "It always",
    "seems",
    "impossible",
    "until",
    "it is done.",
    "- Nelson Mandela",
    "Shall I compare",
    "thee to",
    "a summer's day?",
    "Thou art more",
    "lovely and more",
    "temperate - Shakespeare",
]
MODULO_443 = [119, 54, 308, 97, 179, 437, 84, 300, 214, 135, 118, 228]  # Gazette's regression fixtures.
RENDEZVOUS = [21, 179, 50, 13, 337, 29, 110, 395, 192, 394, 344, 75]


def test_fnv1a32_vectors() -> None:
    assert fnv1a32(b"") == 0x811C9DC5
    assert fnv1a32(b"a") == 0xE40C292C
    assert fnv1a32("foobar") == 0xBF9CF968


def test_a_key_function_returning_neither_str_nor_bytes_is_named() -> None:
    # A user's `lambda m: m.doc["user"]` with an int user id failed as "'int' object is not iterable".
    mapping = modulo_mapping(lambda m: m, lambda: fixture(3))
    with pytest.raises(TypeError, match="mapping key must be str or bytes, got int 42"):
        mapping(42)


def test_modulo_mapping_matches_gazette() -> None:
    parts = fixture(443)
    mapping = modulo_mapping(lambda m: m, lambda: parts)
    for key, want in zip(KEYS, MODULO_443, strict=True):
        assert mapping(key) == (f"a/topic/part-{want:03d}", "application/x-ndjson")


@pytest.mark.parametrize("count", [400, 500])
def test_rendezvous_mapping_matches_gazette_and_is_stable(count: int) -> None:
    parts = fixture(count)
    mapping = rendezvous_mapping(lambda m: m, lambda: parts)
    for key, want in zip(KEYS, RENDEZVOUS, strict=True):
        assert mapping(key) == (f"a/topic/part-{want:03d}", "application/x-ndjson")


def test_rendezvous_ties_go_to_lowest_index() -> None:
    same = [JournalSpec("x", NDJSON), JournalSpec("x", {"content-type": "text/csv"})]
    assert rendezvous_mapping(lambda m: m, lambda: same)("k") == ("x", "application/x-ndjson")


def test_random_mapping_spreads() -> None:
    parts = fixture(100)
    mapping = random_mapping(lambda: parts)
    assert len({mapping(None)[0] for _ in range(101)}) > 1  # Chance of failure: 1e-200.


@pytest.mark.parametrize(
    "make",
    [lambda p: modulo_mapping(lambda m: m, p), lambda p: rendezvous_mapping(lambda m: m, p), random_mapping],
)
def test_empty_partitions_is_a_clear_error(make: object) -> None:
    mapping = make(lambda: [])  # type: ignore[operator]
    with pytest.raises(EmptyPartitionsError, match="no journals"):
        mapping("key")


def test_selector_parsing_and_matching() -> None:
    sel = parse_selector("topic=pageviews, source in (mobile, web), !deprecated, region, tier notin (cold)")
    assert sel == LabelSelector(
        {"topic": frozenset({"pageviews"}), "source": frozenset({"mobile", "web"}), "region": frozenset()},
        {"deprecated": frozenset(), "tier": frozenset({"cold"})},
    )
    ok = {"topic": "pageviews", "source": "web", "region": "eu"}
    assert sel.matches(ok)
    assert not sel.matches({**ok, "source": "tv"})
    assert not sel.matches({**ok, "deprecated": "yes"})
    assert not sel.matches({"topic": "pageviews", "source": "web"})  # region missing
    assert not sel.matches({**ok, "tier": "cold"})
    assert sel.matches({**ok, "tier": "hot"})
    assert parse_selector(str(sel)) == sel
    assert parse_selector("") == LabelSelector() and LabelSelector().matches({})


@pytest.mark.parametrize(
    "text",
    [
        "a=",
        "=b",
        "a==b",
        "a in ()",
        "a in (b",
        "a b",
        "a=b,",
        ",a=b",
        "a=b,,c=d",
        "a, !a",
        "!a, a!=b",
        "a=(b)",
    ],
)
def test_malformed_selectors(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_selector(text)


def test_partitions_from_lister() -> None:
    journals = InMemoryJournals(
        [
            JournalSpec("pageviews/part-001", {**NDJSON, "topic": "pageviews", "source": "mobile"}),
            JournalSpec("pageviews/part-000", {**NDJSON, "topic": "pageviews", "source": "mobile"}),
            JournalSpec("pageviews/web-000", {**NDJSON, "topic": "pageviews", "source": "web"}),
        ]
    )
    parts = partitions_from(journals, "topic=pageviews, source=mobile", refresh_interval=3600)
    first = parts()
    assert [s.name for s in first] == ["pageviews/part-000", "pageviews/part-001"]
    journals.create(JournalSpec("pageviews/part-002", {**NDJSON, "topic": "pageviews", "source": "mobile"}))
    assert parts() is first  # Cached until the refresh interval passes.
    assert len(partitions_from(journals, "topic=pageviews, source=mobile", refresh_interval=0)()) == 3
    with pytest.raises(SelectorError):
        partitions_from(journals, "topic==x")


@pytest.mark.parametrize("returned", ["events/0", "ab", ("events/0",), None])
def test_a_mapping_returning_no_journal_and_content_type_pair_is_a_type_error_naming_it(
    tmp_path: Any, returned: Any
) -> None:
    """Issue 39, item 12: a custom mapping returning a bare journal name failed with a raw "too many values to
    unpack" (and a two-character name was taken apart as a journal and a content type)."""

    def my_mapping(msg: Any) -> Any:
        return returned

    with FileJournals(tmp_path) as store:
        store.create(JournalSpec("events/0", NDJSON))
        with AsyncPublisher(store) as pub:
            for publish in (pub.publish_committed, pub.publish_uncommitted):
                with pytest.raises(
                    TypeError,
                    match=r"mapping .*my_mapping returned .*: a mapping returns a \(journal, content_type\) pair",
                ):
                    publish(my_mapping, JsonMessage({"a": 1}))
            pub.publish_committed(lambda m: ("events/0", NDJSON["content-type"]), JsonMessage({"a": 2}))
            pub.barrier()
        assert store.end("events/0") > 0  # the publisher goes on: nothing of the refused messages appended before
