"""SQLite under a stream of writes from other processes: the worker keeps its lease, and a
burst of acknowledgements that cannot be written is retried and logged per batch.

A fleet-wide pause acknowledged by many workers on one SQLite file is a stream of short write
transactions from many processes. SQLite's own busy handler sleeps longer and longer between
its tries (100 ms after the first few), so a writer that has waited a while almost never finds
the lock free when it looks: lease renewals ran into their busy timeout and workers fenced
themselves, and each acknowledgement of a failed batch logged a line of its own, thousands a
worker (docs/agent.md "Bursts").
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from locstatus import Operation, State, connect
from locstatus.backends import AckItem
from locstatus.backends.sqlite import SQLiteBackend
from locstatus.errors import VersionConflict

from support.kits_zk import wait_until

SVC = "replication"
CTX = mp.get_context("spawn")


def eventually(check: Callable[[], Any], timeout: float = 60.0) -> None:
    wait_until(check, timeout=timeout)


def _hammer(path: str, stop: Any, hold: float, gap: float) -> None:
    """Another process's writes: hold the write lock ``hold`` seconds, let go for up to
    ``gap`` seconds (random), again, until ``stop`` is set."""
    db = sqlite3.connect(path, isolation_level=None, timeout=60)
    db.execute("CREATE TABLE IF NOT EXISTS scratch (n INTEGER)")
    while not stop.is_set():
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO scratch (n) VALUES (1)")
        time.sleep(hold)
        db.execute("COMMIT")
        time.sleep(random.uniform(0, gap))
    db.close()


@pytest.fixture
def hammers(tmp_path: Path) -> Iterator[Callable[[int], None]]:
    stop = CTX.Event()
    procs: list[Any] = []

    def start(n: int) -> None:
        for _ in range(n):
            p = CTX.Process(
                target=_hammer, args=(str(tmp_path / "locstatus.db"), stop, 0.02, 0.02),
                daemon=True,
            )
            p.start()
            procs.append(p)

    yield start
    stop.set()
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()


def test_lease_renewals_get_through_a_stream_of_other_processes_writes(
    tmp_path: Path, hammers: Callable[[int], None]
) -> None:
    """Eight processes each write for 20 ms, then pause up to 20 ms, again and again (the lock
    is wanted more than it is free): every renewal of a worker with a 3 s lease (busy timeout
    2 s) lands, and the worker never fences. On SQLite's own busy handler some waited over
    a second."""
    url = f"sqlite:///{tmp_path / 'locstatus.db'}?timeout=2"
    mgr = connect(url, services=[SVC])
    mgr.sync_locations(["us-east-1"])
    agent = connect(url, services=[SVC]).agent(
        "w1", services=[SVC], lease_seconds=3, heartbeat_interval=0.3
    )
    agent.start()
    try:
        hammers(8)
        time.sleep(1.0)  # the hammers are at it (spawned processes start slowly)
        base = agent.metrics()
        eventually(lambda: agent.metrics()["heartbeats"] - base["heartbeats"] >= 30, timeout=60)
        got = agent.metrics()
        assert got["heartbeat_errors"] == base["heartbeat_errors"], got
        assert got["fences"] == 0 and got["fenced"] == 0, got
    finally:
        agent.stop()


def test_a_burst_whose_acknowledgements_cannot_be_written_logs_per_batch_not_per_location(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The write lock is held by another connection while 300 locations are acknowledged:
    the acknowledgements fail (busy timeout 0.2 s), are tried again together and logged a
    few lines in all (one once went per location); once the lock is free every one lands and
    the pause settles."""
    path = tmp_path / "locstatus.db"
    url = f"sqlite:///{path}?timeout=0.2"
    names = [f"loc-{i:03d}" for i in range(300)]
    mgr = connect(f"sqlite:///{path}", services=[SVC])
    mgr.sync_locations(names)
    gate = threading.Event()
    agent = connect(url, services=[SVC]).agent("w1", services=[SVC], lease_seconds=60)
    agent.on_pause(SVC)(lambda _loc: gate.wait(60) and None)
    agent.on_resume(SVC)(lambda _loc: None)
    agent.start()
    try:
        report = mgr.bulk(Operation.pause(SVC))
        assert not report.failed
        gen = report.items[0].status.services[SVC].generation  # type: ignore[union-attr]
        lock = sqlite3.connect(path, isolation_level=None, timeout=30)
        eventually(lambda: agent.metrics()["running"] > 0)  # the burst reached the handlers
        lock.execute("BEGIN IMMEDIATE")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="locstatus.agent"):
            gate.set()
            eventually(lambda: agent.metrics()["backend_errors"] > 0)
            time.sleep(2.0)  # failing and retrying for a while
            lock.execute("ROLLBACK")
            lock.close()
            eventually(lambda: all(agent.observed_generation(n, SVC) == gen for n in names))
        lines = [r.getMessage() for r in caplog.records if "acknowledg" in r.getMessage()]
        assert 1 <= len(lines) <= 5, lines
        assert all("retrying them together" in line for line in lines), lines
        eventually(lambda: all(
            mgr.status(n).services[SVC].state is State.PAUSED for n in names
        ))
    finally:
        gate.set()
        agent.stop()


def test_an_acknowledgement_whose_record_moves_between_its_read_and_its_write_is_judged_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ack_many`` judges the batch against records read before the write lock; a record
    that moves in between is judged again inside the write: one acknowledged at the version
    applied (``if_version``) is refused, one without it is written when its generation is
    still the record's."""
    url = f"sqlite:///{tmp_path / 'locstatus.db'}"
    mgr = connect(url, services=[SVC])
    mgr.sync_locations(["a", "b", "c"])
    backend = SQLiteBackend(url)
    at = {loc: mgr.status(loc) for loc in "abc"}
    read = SQLiteBackend._ack_rows

    def read_then_move(self: SQLiteBackend, locations: Any) -> Any:
        rows = read(self, locations)
        for loc in ("a", "b"):  # a write that keeps the generation (a reason, say)
            mgr.backend.compare_and_set(at[loc], at[loc].version, [])
        return rows

    monkeypatch.setattr(SQLiteBackend, "_ack_rows", read_then_move)
    got = backend.ack_many("w1", [
        AckItem("a", SVC, 0, at["a"].version),  # applied at the old version: refused
        AckItem("b", SVC, 0, None),  # no version asked: generation 0 is still b's
        AckItem("c", SVC, 0, at["c"].version),  # did not move: written
    ])
    assert isinstance(got[0], VersionConflict) and got[1] is None and got[2] is None, got
    assert "w1" not in backend.acks("a")
    assert backend.acks("b")["w1"][SVC] == 0 and backend.acks("c")["w1"][SVC] == 0
    backend.close()
