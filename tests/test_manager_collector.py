"""A bulk operation runs with CPython's cyclic collector held off and gives it back as it found
it (locstatus/manager/collector.py): the collector's re-scans of every live object made a
100 000-location pause quadratic (docs/benchmarks.md, "Bulk operations")."""

from __future__ import annotations

import gc
import threading
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
