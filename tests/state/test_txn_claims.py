"""The claim and save races of a publishing application's fenced checkpoints (:mod:`zcluster.state.txn`), on
real redis-server shards: a save landing between a claim's load and its insert is adopted; two claims of one
generation never both win; a claim fences every later save of older generations, which the server refuses;
a v3 checkpoint is carried over by the first claim."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zcluster import Cluster, ConfigError, FencedError, ShardError
from zcluster.journal import FileJournals
from zcluster.journal.files import LostRange
from zcluster.message.framing import CONTENT_TYPE_NDJSON
from zcluster.message.journals import JournalSpec
from zcluster.message.producer import AckIntent
from zcluster.state import StateStore
from zcluster.state import store as store_module
from zcluster.state.txn import TxnCheckpoint, TxnStore
from zcluster.testing import LocalShards

_ids = itertools.count()
J = "in/0"


@pytest.fixture
def state(shards: LocalShards) -> Iterator[StateStore]:
    with Cluster.from_urls(shards.urls, prefix=f"tc{next(_ids)}:") as c:
        yield StateStore(c, f"tc-app-{uuid.uuid4().hex[:8]}")  # the state namespace is shared by every test module


def next_save(cp: TxnCheckpoint, offset: int, target: str) -> TxnCheckpoint:
    return cp._replace(offset=offset, seq=cp.seq + 1, intents=[AckIntent(target, f"ack {offset}\n".encode())])


class Interleaved(TxnStore):
    """A TxnStore whose next ``load`` runs ``meanwhile`` right after reading (another process's step lands
    between this claim's load and its insert)."""

    def __init__(self, state: StateStore, meanwhile: object) -> None:
        super().__init__(state)
        self.meanwhile = meanwhile

    def load(self, journal: str) -> TxnCheckpoint:
        held = super().load(journal)
        step, self.meanwhile = self.meanwhile, None
        if callable(step):
            step()
        return held


def test_a_save_landing_between_a_claims_load_and_insert_is_adopted(state: StateStore) -> None:
    zombie = TxnStore(state)
    held = zombie.claim(J, b"\x01" * 6)
    held = zombie.save_journal(J, next_save(held, 10, "out/0"))
    late: list[TxnCheckpoint] = []

    def zombie_saves() -> None:
        late.append(zombie.save_journal(J, next_save(held, 20, "out/1")))

    claimed = Interleaved(state, zombie_saves).claim(J, b"\x02" * 6)
    assert late and late[0].offset == 20  # the zombie's save landed (and read itself back as the newest)
    # The claim continues from it, with its intents (the claimer appends them): nothing is lost or doubled.
    assert (claimed.offset, claimed.intents, claimed.gen) == (20, late[0].intents, 2)
    with pytest.raises(FencedError) as fenced:
        zombie.save_journal(J, next_save(late[0], 30, "out/0"))
    assert (fenced.value.mine, fenced.value.theirs) == (1, 2)
    assert TxnStore(state).load(J).offset == 20


def test_two_claims_of_one_generation_never_both_win(state: StateStore) -> None:
    first = TxnStore(state)
    first.claim(J, b"\x01" * 6)
    won: list[TxnCheckpoint] = []
    rival = Interleaved(state, lambda: won.append(TxnStore(state).claim(J, b"\x03" * 6)))
    with pytest.raises(FencedError):
        rival.claim(J, b"\x02" * 6)  # it loaded generation 1, claimed 2 after the other claim of 2 won
    assert won and won[0].gen == 2
    newest = TxnStore(state).load(J)
    assert (newest.gen, newest.owner) == (2, b"\x03" * 6)  # the loser's record was withdrawn
    saved = TxnStore(state).save_journal(J, next_save(won[0], 5, "out/0"))
    assert TxnStore(state).load(J) == saved._replace(saved_at=TxnStore(state).load(J).saved_at)


def test_a_claim_carries_a_v3_checkpoint_over_and_fences_older_saves(state: StateStore) -> None:
    state.save_journal(J, 42, [], journal_id="uid1")
    claimed = TxnStore(state).claim(J, b"\x01" * 6)
    assert (claimed.offset, claimed.journal_id, claimed.gen, claimed.intents) == (42, "uid1", 1, [])
    assert state.load_journal(J).offset == 42
    later = TxnStore(state).claim(J, b"\x02" * 6)
    # The first claimer's save is below the second claim's floor: the server refuses it.
    stale = next_save(claimed, 50, "out/0")
    with pytest.raises(FencedError):
        TxnStore(state).save_journal(J, stale)
    assert TxnStore(state).load(J).offset == 42 and later.gen == 2


class OneLostRange:
    """A journal store reporting one lost range of every journal (what skip_lost checks)."""

    def __init__(self, begin: int, end: int) -> None:
        self.range = LostRange(begin, end, "test")

    def lost_ranges(self, journal: str) -> list[LostRange]:
        return [self.range]


def test_an_operator_skip_refuses_when_an_applier_moves_the_checkpoint_under_it(
    state: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    applier = TxnStore(state)
    held = applier.save_journal(J, next_save(applier.claim(J, b"\x01" * 6), 10, "out/0"))

    def moves() -> None:  # the applier saves once more between the skip's checks and its claim
        applier.save_journal(J, next_save(held, 15, "out/1"))

    monkeypatch.setattr(store_module, "TxnStore", lambda s: Interleaved(s, moves))
    with pytest.raises(ConfigError, match=r"moved while skipping lost range 10\.\.20 \(offset 10 -> 15\)"):
        state.skip_lost(OneLostRange(10, 20), J, 10, 20, reason="test")
    after = TxnStore(state).load(J)
    # Nothing skipped and nothing audited: the claim stands, an unchanged copy of the applier's last save.
    assert (after.offset, after.gen, [i.journal for i in after.intents]) == (15, 2, ["out/1"])
    assert state.audit() == []


class ClaimedBeforeSave(TxnStore):
    """A TxnStore whose next ``save_journal`` runs ``meanwhile`` first (an applier claims between an operator's
    claim and its save)."""

    def __init__(self, state: StateStore, meanwhile: object) -> None:
        super().__init__(state)
        self.meanwhile = meanwhile

    def save_journal(self, journal: str, saved: TxnCheckpoint) -> TxnCheckpoint:
        step, self.meanwhile = self.meanwhile, None
        if callable(step):
            step()
        return super().save_journal(journal, saved)


def test_an_operator_skip_fenced_by_an_applier_before_its_save_is_not_audited(
    state: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the skip's audit entry was written while checking the claimed checkpoint, before the fenced
    save: fenced, the audit said "skipped by operator" and the checkpoint had not moved."""
    applier = TxnStore(state)
    applier.save_journal(J, next_save(applier.claim(J, b"\x01" * 6), 10, "out/0"))

    def claims() -> None:  # the applier's next poll
        TxnStore(state).claim(J, b"\x03" * 6)

    monkeypatch.setattr(store_module, "TxnStore", lambda s: ClaimedBeforeSave(s, claims))
    with pytest.raises(FencedError):
        state.skip_lost(OneLostRange(10, 20), J, 10, 20, reason="test")
    assert TxnStore(state).load(J).offset == 10
    assert state.audit() == []


def test_an_operator_skip_whose_audit_fails_moves_nothing(state: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit entry comes before the save: when it cannot be written, nothing moves (before: the skip was
    saved first, then reported as "skipped but not audited")."""
    applier = TxnStore(state)
    applier.save_journal(J, next_save(applier.claim(J, b"\x01" * 6), 10, "out/0"))

    def failing(*args: object, **kwargs: object) -> None:
        raise ShardError("injected: the audit key's shard failed", [])

    monkeypatch.setattr(state, "record_skip", failing)
    with pytest.raises(ShardError, match="injected"):
        state.skip_lost(OneLostRange(10, 20), J, 10, 20, reason="test")
    assert TxnStore(state).load(J).offset == 10  # not skipped
    assert state.audit() == []


class ClaimedDuringSave(TxnStore):
    """A TxnStore whose next ``save_journal`` runs ``meanwhile`` between its insert and its read-back (an
    applier's claim reads the operator's saved record as the newest and adopts it)."""

    def __init__(self, state: StateStore, meanwhile: object) -> None:
        super().__init__(state)
        self.meanwhile = meanwhile
        self.saving = False

    def save_journal(self, journal: str, saved: TxnCheckpoint) -> TxnCheckpoint:
        self.saving = True
        return super().save_journal(journal, saved)

    def _records(self, journal: str) -> list[Any]:
        if self.saving:  # the save's read-back: its insert has landed
            self.saving = False
            step, self.meanwhile = self.meanwhile, None
            if callable(step):
                step()
        return super()._records(journal)


def test_an_operator_skip_adopted_by_a_racing_claim_is_audited(
    state: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39 item 4: the applier's claim lands between the skip's save and its read-back, adopting the
    saved checkpoint: the skip raises FencedError, and the checkpoint has moved past the range. Before, the
    audit was written only after a final save: moved, with no audit entry."""
    applier = TxnStore(state)
    applier.save_journal(J, next_save(applier.claim(J, b"\x01" * 6), 10, "out/0"))

    def claims() -> None:  # the applier's next poll
        TxnStore(state).claim(J, b"\x03" * 6)

    monkeypatch.setattr(store_module, "TxnStore", lambda s: ClaimedDuringSave(s, claims))
    with pytest.raises(FencedError):
        state.skip_lost(OneLostRange(10, 20), J, 10, 20, reason="race")
    assert TxnStore(state).load(J).offset == 20  # adopted: the skip took effect
    (entry,) = state.audit()
    assert (entry["action"], entry["begin"], entry["end"], entry["offset"], entry["by"]) == (
        "skip",
        10,
        20,
        10,
        "operator",
    )


def test_an_operator_restart_appending_to_a_wrong_store_keeps_the_intents(state: StateStore, tmp_path: Path) -> None:
    """``publish=`` a store the application does not publish to (an operator's mistake): the intents go there
    and nowhere useful. Before, the moved checkpoint dropped them once appended: lost, the transaction's
    messages never committed. Now it keeps them, and the application's next claim appends them."""
    applier = TxnStore(state)
    held = applier.save_journal(J, next_save(applier.claim(J, b"\x01" * 6), 10, "out/0"))
    wrong = FileJournals(tmp_path / "elsewhere")
    wrong.create(JournalSpec("out/0", {"content-type": CONTENT_TYPE_NDJSON}))
    state.restart_journal(J, reason="test", publish=wrong)
    assert wrong.end("out/0") > 0  # appended there
    after = TxnStore(state).load(J)
    assert (after.offset, after.gen, after.intents) == (0, 2, held.intents)
    assert TxnStore(state).claim(J, b"\x02" * 6).intents == held.intents  # for the next claim to append


def test_an_operator_restart_adopted_by_a_racing_claim_is_audited(
    state: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the skip above: a restart's save adopted by a claim landing before its read-back is audited."""
    applier = TxnStore(state)
    applier.save_journal(J, next_save(applier.claim(J, b"\x01" * 6), 10, "out/0"))

    def claims() -> None:
        TxnStore(state).claim(J, b"\x03" * 6)

    monkeypatch.setattr(store_module, "TxnStore", lambda s: ClaimedDuringSave(s, claims))
    with pytest.raises(FencedError):
        state.restart_journal(J, reason="race")
    after = TxnStore(state).load(J)
    assert (after.offset, after.base) == (0, 11)  # adopted: restarted
    (entry,) = state.audit()
    assert (entry["action"], entry["offset"], entry["reason"]) == ("restart", 10, "race")
