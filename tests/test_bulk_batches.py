"""Bulk operations written in batches (backend invariant 12, locstatus/manager/bulk.py): a batch
of many locations is still one compare-and-set per location on its own version, so a location
another writer changed between the scan and the batch is read again and re-applied alone, a
location whose batched write had an unknown outcome is resolved by its op_id, and the other
locations of the batch are written once, on every backend."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import pytest

from locstatus import Manager, State
from locstatus.backends import Backend
from locstatus.backends.base import CasItem, CasResult
from locstatus.errors import AmbiguousCommit, VersionConflict
from locstatus.manager import Operation, Outcome
from locstatus.models import LocationStatus

from support.agent_worker import Partition
from support.kits import Kit

NAMES = [f"loc-{i:03d}" for i in range(40)]


class Batching(Partition):
    """The real backend, its batches seen: ``before(items)`` runs ahead of each batch,
    ``after(items, results)`` may rewrite its results; reads are counted per location."""

    def __init__(
        self,
        inner: Backend,
        batch_size: int = 16,
        before: Callable[[Sequence[CasItem]], None] | None = None,
        after: Callable[[Sequence[CasItem], list[CasResult]], list[CasResult]] | None = None,
    ) -> None:
        super().__init__(inner)
        self.batch_size = batch_size
        self.before = before
        self.after = after
        self.reads: Counter[str] = Counter()
        self.batches: list[int] = []

    def read(self, location: str) -> LocationStatus:
        self.reads[location] += 1
        return super().read(location)

    def compare_and_set_many(self, items: Sequence[CasItem]) -> list[CasResult]:
        self.batches.append(len(items))
        if self.before is not None:
            self.before(items)
        results = self.inner.compare_and_set_many(items)
        return results if self.after is None else self.after(items, results)


@pytest.fixture
def stored(kit: Kit) -> Kit:
    Manager(kit.open()).sync_locations({n: ["replication", "lifecycle"] for n in NAMES})
    return kit


def ops(b: Backend, location: str) -> list[str]:
    return [e.op_id for e in b.history(location, limit=100) if e.event != "create"]


def test_a_location_raced_between_the_scan_and_its_batch_is_read_again_and_reapplied_alone(
    stored: Kit,
) -> None:
    other = Manager(stored.open())
    raced = NAMES[21]  # in the middle of the second batch
    done: list[str] = []

    def race(items: Sequence[CasItem]) -> None:
        if not done and raced in {i.record.location for i in items}:
            done.append(other.pause(raced, "lifecycle", op_id="op-other").location)

    backend = Batching(stored.open(), before=race)
    report = Manager(backend).bulk(Operation.pause("replication"), op_id="op-bulk")
    assert done == [raced]
    assert {i.outcome for i in report.items} == {Outcome.CHANGED} and len(report.items) == 40
    assert backend.reads == Counter({raced: 1})  # only the conflicting location read again
    b = stored.open()
    for n in NAMES:
        rec = b.read(n)
        assert rec.services["replication"].state is State.PAUSED
        expected = {"op-bulk": 2, "op-other": 2 if n == raced else 0}  # each change + its settle
        assert Counter(ops(b, n)) == Counter({k: v for k, v in expected.items() if v})
    assert b.read(raced).services["lifecycle"].state is State.PAUSED  # the race kept too
    assert len(backend.batches) >= 2 * 3  # 40 in batches of 16, each change then its settle


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "not-sent"])
def test_an_item_of_a_batch_with_an_unknown_outcome_is_resolved_by_its_op_id(
    stored: Kit, landed: bool
) -> None:
    lost = NAMES[5]

    def ambiguous(items: Sequence[CasItem], results: list[CasResult]) -> list[CasResult]:
        return [
            AmbiguousCommit(f"{lost}: connection lost after send")
            if i.record.location == lost and i.record.services["replication"].state
            is State.PAUSING else r
            for i, r in zip(items, results, strict=True)
        ]

    backend = _Dropping(stored.open(), lost, landed, after=ambiguous)
    report = Manager(backend).bulk(Operation.pause("replication"), op_id="op-bulk")
    assert {i.outcome for i in report.items} == {Outcome.CHANGED}
    b = stored.open()
    assert Counter(ops(b, lost)) == Counter({"op-bulk": 2})  # paused once, settled once
    assert b.read(lost).services["replication"].state is State.PAUSED
    assert backend.reads[lost] >= 1 and sum(backend.reads.values()) == backend.reads[lost]


class _Dropping(Batching):
    """Batches whose item at ``lost`` is not sent at all (``landed`` False) or is sent, each
    result then passed through ``after``."""

    def __init__(self, inner: Backend, lost: str, landed: bool, **kw: object) -> None:
        super().__init__(inner, **kw)  # type: ignore[arg-type]
        self.lost, self.landed = lost, landed

    def compare_and_set_many(self, items: Sequence[CasItem]) -> list[CasResult]:
        self.batches.append(len(items))
        if self.landed:
            results = self.inner.compare_and_set_many(items)
        else:
            sent = [i for i in items if i.record.location != self.lost]
            by_location = dict(
                zip((i.record.location for i in sent), self.inner.compare_and_set_many(sent),
                    strict=True)
            )
            results = [
                by_location.get(i.record.location, VersionConflict("not sent")) for i in items
            ]
        return results if self.after is None else self.after(items, results)


def test_a_fleet_is_a_few_batches_and_every_location_reported(kit: Kit) -> None:
    names = [f"fleet-{i:05d}" for i in range(250)]
    Manager(kit.open()).sync_locations({n: ["replication"] for n in names})
    backend = Batching(kit.open(), batch_size=100)
    report = Manager(backend).bulk(Operation.pause("replication"))
    assert [i.location for i in report.items] == names
    assert {i.outcome for i in report.items} == {Outcome.CHANGED}
    assert backend.batches == [100, 100, 100, 100, 50, 50]  # each pause, then its settle
    assert sum(backend.reads.values()) == 0
    assert all(
        i.status is not None and i.status.services["replication"].state is State.PAUSED
        for i in report.items
    )


def test_a_list_given_out_of_order_over_several_batches_is_reported_in_location_order(
    stored: Kit,
) -> None:
    """The report is sorted by location whatever order the list came in and however it was
    batched, an unknown one in its place, and each location's changed services are
    in name order (what the CLI prints, docs/cli.md, "Bulk: `all`")."""
    backend = Batching(stored.open(), batch_size=16)
    asked = [*reversed(NAMES), "loc-0155"]
    report = Manager(backend).bulk(Operation.pause(), asked)
    assert [i.location for i in report.items] == sorted(asked)
    assert backend.batches == [16, 16, 16, 16, 8, 8]  # each pause, then its settle
    unknown = report.items[16]  # between loc-015 and loc-016
    assert unknown.location == "loc-0155" and unknown.outcome is Outcome.FAILED
    written = [i for i in report.items if i is not unknown]
    assert {i.outcome for i in written} == {Outcome.CHANGED}
    assert {i.changed for i in written} == {("lifecycle", "replication")}
