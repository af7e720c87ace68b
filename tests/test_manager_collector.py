"""A bulk operation runs with CPython's cyclic collector held off and gives it back as it found
it (locstatus/manager/collector.py): the collector's re-scans of every live object made a
100 000-location pause quadratic (docs/benchmarks.md, "Bulk operations")."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator

import pytest

from locstatus import Manager
from locstatus.backends.memory import MemoryBackend
from locstatus.manager import BulkItem, Operation
from locstatus.manager.collector import collection_paused


@pytest.fixture
def mgr() -> Iterator[Manager]:
    m = Manager(MemoryBackend())
    m.sync_locations({f"loc-{i}": ["replication"] for i in range(5)})
    yield m
    gc.enable()


def test_a_bulk_operation_holds_the_collector_off_and_enables_it_again(mgr: Manager) -> None:
    seen: list[bool] = []

    def progress(_item: BulkItem, _done: int, _total: int | None) -> None:
        seen.append(gc.isenabled())

    assert gc.isenabled()
    mgr.bulk(Operation.pause("replication"), progress=progress)
    assert seen == [False] * 5 and gc.isenabled()


def test_a_collector_disabled_before_stays_disabled(mgr: Manager) -> None:
    gc.disable()
    mgr.bulk(Operation.pause("replication"))
    assert not gc.isenabled()


def test_the_collector_comes_back_only_when_the_last_of_overlapping_bulks_ends() -> None:
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with collection_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    inside.wait(10)
    with collection_paused():
        pass
    assert not gc.isenabled()  # the other thread's block still runs
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_an_error_inside_gives_the_collector_back() -> None:
    with pytest.raises(RuntimeError), collection_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_what_a_bulk_leaves_alive_goes_to_the_oldest_generation(mgr: Manager) -> None:
    """The report's records are left to the next full collection (the young ones do not scan
    them), which frees the cyclic garbage made during the operation: nothing leaks."""
    made: list[weakref.ref[_Cycle]] = []

    def progress(_item: BulkItem, _done: int, _total: int | None) -> None:
        made.append(weakref.ref(_Cycle()))  # garbage with a cycle: only the collector frees it

    report = mgr.bulk(Operation.pause("replication"), progress=progress)
    record = report.items[0].status
    assert gc.get_freeze_count() == 0
    for young in (0, 1):
        assert not any(o is record for o in gc.get_objects(generation=young))
    assert any(o is record for o in gc.get_objects(generation=2))
    gc.collect(0)
    assert all(r() is not None for r in made)  # a young collection does not see them
    gc.collect()
    assert made and all(r() is None for r in made)


def test_objects_the_process_froze_itself_stay_frozen() -> None:
    """A process that uses ``gc.freeze`` itself (e.g. before forking) keeps what it froze."""
    m = Manager(MemoryBackend())
    m.sync_locations({f"loc-{i}": ["replication"] for i in range(5)})
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        m.bulk(Operation.pause("replication"))
        assert 0 < gc.get_freeze_count() <= frozen  # not thawed (some may have been freed)
    finally:
        gc.unfreeze()
