"""A positioned source's partition ledger (:mod:`zcluster.state.ledger`): it tells a replay (rows applied
before) from a late row (below the fence, never applied), on real redis-server shards with real fenced
increments, as :class:`zcluster.spark.PositionedSink` sends them. The Spark test of the same fault is
``tests/spark/test_positioned_order.py``."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from zcluster import Cluster, ConfigError, Count
from zcluster.state import StateStore
from zcluster.state.ledger import NUMBERED, Ledger, LedgerState, classify
from zcluster.testing import LocalShards

_ids = itertools.count()


@pytest.fixture
def cluster(shards: LocalShards) -> Iterator[Cluster]:
    with Cluster.from_urls(shards.urls, prefix=f"lg{next(_ids)}:") as c:
        yield c


def app(cluster: Cluster) -> str:
    """The test's application (the ledger's records share one namespace whatever the cluster's prefix)."""
    return "app" + cluster.prefix.decode().rstrip(":")


def ledger_records(cluster: Cluster) -> list[str]:
    key = f"{app(cluster)}/ledger/{cluster.prefix.decode()}|t/0"
    return [str(r.member) for r in StateStore(cluster, app(cluster)).cluster.select([key], limit=100)[key]]


def apply(
    cluster: Cluster, offsets: Sequence[int], late: str = "fail", *, send: int | None = None, max_holes: int = 4096
) -> int:
    """One application of ``offsets`` of partition t/0 as the sink makes it: plan (claim), one Count per row
    at its position, finish; ``send``: send only that many increments and stop (the task dies before its
    done mark). Returns how many increments took effect."""
    ledger = Ledger(StateStore(cluster, app(cluster)), "t", 0, late, prefix=cluster.prefix, max_holes=max_holes)
    plan = ledger.plan(sorted(offsets))
    items = [((plan.position(o), o), Count("clicks", f"u{o % 7}", 1)) for o in plan.apply]
    result = cluster.increment(f"{app(cluster)}/t/0", items[:send] if send is not None else items)
    if send is None:
        ledger.finish(plan)
    return result.applied_count


def total(cluster: Cluster) -> int:
    return sum(cluster.counters(["clicks"])["clicks"].values())


def test_holes_split_by_late_offsets_and_bounded() -> None:
    state = LedgerState().after([0, 1, 2, 5, 6, 9])
    assert (state.high, state.holes) == (10, ((3, 5), (7, 9)))
    assert classify(state, [1, 3, 4, 8, 10]) == ([10], [3, 4, 8], [1])
    state = state.after([4, 8])
    assert state.holes == ((3, 4), (7, 8))
    bounded = LedgerState().after(list(range(0, 20, 2)), max_holes=3)  # holes 1, 3, ..., 17: 9 of them
    assert (bounded.holes, bounded.horizon) == (((13, 14), (15, 16), (17, 18)), 12)
    assert bounded.kind(11) == "replay" and bounded.kind(13) == "late"  # below the horizon: taken as applied


def test_a_late_batch_fails_by_default_naming_partition_offsets_and_fence(cluster: Cluster) -> None:
    """Batch 1 holds offsets 0..199 and 400..599, batch 2 offsets 200..399 (a file source's tie). Before the
    ledger the fence refused batch 2 as applied before: 200 rows short, no error."""
    assert apply(cluster, [*range(200), *range(400, 600)]) == 400
    with pytest.raises(ConfigError) as err:
        apply(cluster, range(200, 400))
    text = str(err.value)
    assert "partition t/0" in text and "offsets 200..399 (200 rows)" in text and "up to 599" in text
    assert total(cluster) == 400  # nothing of the late batch written
    assert apply(cluster, [*range(200), *range(400, 600)]) == 0  # a replay is no error: fenced, as before
    assert total(cluster) == 400


def test_late_rows_apply_exactly_once_with_the_option(cluster: Cluster) -> None:
    assert apply(cluster, [*range(200), *range(400, 600)], "apply") == 400
    assert apply(cluster, [*range(200, 300), *range(600, 700)], "apply") == 200  # late and fresh together
    assert apply(cluster, range(300, 400), "apply") == 100
    assert total(cluster) == 700
    for batch in ([*range(200), *range(400, 600)], range(200, 400), range(700)):  # replays, any cut
        assert apply(cluster, batch, "apply") == 0
    assert total(cluster) == 700
    assert len(ledger_records(cluster)) <= 4  # the last two applications' records
    assert apply(cluster, range(700, 710)) == 10  # numbered positions stay, whatever the option now
    assert cluster.fences(["clicks"])["clicks"][f"{app(cluster)}/t/0"].position[0] > NUMBERED


def test_an_unfinished_application_is_finished_by_the_same_batch_only(cluster: Cluster) -> None:
    """A task dies after sending 150 of its 300 increments, before its done mark: a different batch is
    refused (it could move a fence past the unfinished rows), the same batch run again finishes it once."""
    apply(cluster, range(100), "apply")
    first = [*range(100, 200), *range(300, 500)]
    assert apply(cluster, first, "apply", send=150) == 150
    with pytest.raises(ConfigError, match=r"partition t/0: an earlier attempt of application 2 .* did not finish"):
        apply(cluster, range(100, 600), "apply")
    assert apply(cluster, first, "apply") == 150
    assert apply(cluster, range(200, 300), "apply") == 100  # late, after it
    assert total(cluster) == 500


def test_the_ledger_stays_bounded_over_many_gapped_batches(cluster: Cluster) -> None:
    """Offsets with real gaps (Kafka's transaction markers) leave holes that never fill: the ledger keeps the
    newest ``max_holes`` and takes older offsets for applied."""
    for b in range(30):
        apply(cluster, range(b * 20, b * 20 + 20, 2), max_holes=16)
    records = ledger_records(cluster)
    claims = [r for r in records if r.startswith("claim|")]
    assert len(records) <= 4 and all(r.count(",") <= 2 * 16 for r in claims)
    assert total(cluster) == 300


def test_two_attempts_of_one_application_share_its_claim(cluster: Cluster) -> None:
    """A speculative copy (or a retry) planning the same rows while the first attempt runs: the same claim, the
    same positions; whatever each sends, every increment counts once."""
    apply(cluster, range(100), "apply")
    apply(cluster, range(200, 300), "apply")
    late = [*range(100, 200), *range(300, 400)]
    state = StateStore(cluster, app(cluster))
    first = Ledger(state, "t", 0, "apply", prefix=cluster.prefix).plan(late)
    second = Ledger(state, "t", 0, "apply", prefix=cluster.prefix).plan(late)
    assert first == second and first.state.numbered
    for plan, part in ((first, slice(0, 150)), (second, slice(None))):
        items = [((plan.position(o), o), Count("clicks", f"u{o % 7}", 1)) for o in plan.apply[part]]
        cluster.increment(f"{app(cluster)}/t/0", items)
    for plan in (first, second):
        Ledger(state, "t", 0, "apply", prefix=cluster.prefix).finish(plan)
    assert total(cluster) == 400


class Raced(Ledger):
    """A ledger whose first read is followed at once by ``rival``'s whole plan (another batch of the partition
    claiming the same application number in between)."""

    def __init__(self, rival: Callable[[], object], *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.rival: Callable[[], object] | None = rival

    def _records(self) -> Any:
        records = super()._records()
        if self.rival is not None:
            rival, self.rival = self.rival, None
            rival()
        return records


def test_a_rival_claim_of_the_same_number_is_refused_and_withdrawn(cluster: Cluster) -> None:
    apply(cluster, range(100))
    state = StateStore(cluster, app(cluster))
    plans = []
    racer = Raced(
        lambda: plans.append(Ledger(state, "t", 0, "fail", prefix=cluster.prefix).plan(range(100, 200))),
        state,
        "t",
        0,
        "fail",
        prefix=cluster.prefix,
    )
    with pytest.raises(ConfigError, match=r"partition t/0: another application .* claimed number 2"):
        racer.plan(range(100, 300))
    claim = plans[0].claim
    assert claim is not None and [r for r in ledger_records(cluster) if r.startswith("claim|2|")] == [claim.member]
    items = [((plans[0].position(o), o), Count("clicks", f"u{o % 7}", 1)) for o in plans[0].apply]
    cluster.increment(f"{app(cluster)}/t/0", items)
    Ledger(state, "t", 0, "fail", prefix=cluster.prefix).finish(plans[0])
    assert apply(cluster, range(100, 300)) == 100  # the refused batch again: the rival's rows are replays
    assert total(cluster) == 300
