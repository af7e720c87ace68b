"""The worker agent under faults (docs/agent.md, "Failures"): on every backend kit, in-process.

- no agent thread dies: raw errors out of the backend (what an unmapped driver error looks like),
  handlers raising ``BaseException`` (``asyncio.CancelledError``, ``SystemExit``), and a
  ``KeyboardInterrupt`` that stops the agent cleanly;
- what the worker does with a corrupt record, a location purged while it was cut off, other
  services' scheduled resumes, and what its registration publishes.

Self-fencing with real server faults is tests/test_agent_fencing.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from locstatus import Client, SettleTimeout, State
from locstatus.agent import Agent, HandlerRetry
from locstatus.check import render_report, run_check
from locstatus.cli import app
from locstatus.clock import CallerClock
from locstatus.models import utcnow

from support import corrupt_shapes as shapes
from support.agent_worker import Partition
from support.fakeclock import FakeClock
from support.kits import Kit

LOC = "us-east-1"
OTHER = "eu-west-1"
THIRD = "ap-south-1"
SVC = "replication"
FAST: dict[str, Any] = {"lease_seconds": 2.0, "handler_retry": HandlerRetry(base=0.05, cap=0.2)}


def eventually(check: Callable[[], Any], timeout: float = 20.0, every: float = 0.02) -> Any:
    """Poll ``check`` until it returns a truthy value; fail with its last value after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        time.sleep(every)


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for a in started:
        a.stop()


def acked(mgr: Client, worker: str, location: str = LOC, service: str = SVC) -> int | None:
    return mgr.backend.acks(location).get(worker, {}).get(service)


def state(mgr: Client, location: str = LOC, service: str = SVC) -> State:
    return mgr.status(location).services[service].state


class RawErrors(Partition):
    """The real backend behind a switch: while :meth:`cut`, every call raises a bare
    ``RuntimeError`` (a driver error nobody mapped, e.g. pymongo's ``DocumentTooLarge``
    before it was) and hints are dropped."""

    def _check(self) -> None:
        if self._cut.is_set():
            raise RuntimeError("raw driver error (test fault injector)")


# -- no agent thread dies -----------------------------------------------------------------------


def test_raw_backend_errors_kill_no_thread(kit: Kit, agents: list[Agent]) -> None:
    """Heartbeat, watch and apply threads all meet an error that is not a LocstatusError; once
    the backend answers again the worker is alive, reads the change it missed, applies it and
    acknowledges it (before: the heartbeat thread died, the worker read as dead, and the next
    pause settled without its handler running)."""
    link = RawErrors(kit.open())
    mgr = Client(kit.open())
    mgr.sync_locations([LOC])
    calls: list[str] = []
    agent = Client(link).agent("w1", services=[SVC], resync_interval=0.3, **FAST)
    agents.append(agent)
    agent.on_pause(SVC)(lambda location: calls.append(f"pause {location}"))
    agent.on_resume(SVC)(lambda location: calls.append(f"resume {location}"))
    agent.start()
    link.cut()
    time.sleep(1.0)  # several heartbeats, resyncs and retries fail
    link.heal()
    time.sleep(FAST["lease_seconds"] + 0.5)  # past a lease: only a live heartbeat keeps it
    assert any(w.worker_id == "w1" and w.alive(mgr.clock()) for w in mgr.workers())
    assert mgr.pause(LOC, SVC, wait=10).services[SVC].state is State.PAUSED
    assert acked(mgr, "w1") == 1 and calls[-1] == f"pause {LOC}"
    assert agent.metrics()["backend_errors"] + agent.metrics()["heartbeat_errors"] > 0


@pytest.mark.parametrize("error", [asyncio.CancelledError, SystemExit, GeneratorExit])
def test_a_handler_raising_base_exception_is_a_handler_error_and_retried(
    kit: Kit, agents: list[Agent], error: type[BaseException]
) -> None:
    """Before: the BaseException killed the apply thread for good; the worker stayed
    registered, never acknowledged again, and agent.errors() was empty."""
    mgr = Client(kit.open())
    mgr.sync_locations([LOC, OTHER])
    agent = mgr.agent("w1", services=[SVC], **FAST)
    agents.append(agent)
    left = [3]

    @agent.on_pause(SVC)
    def stop(location: str) -> None:
        if location == LOC and left[0] > 0:
            left[0] -= 1
            raise error("handler gave up")

    agent.start()
    mgr.pause(LOC, SVC)
    key = f"{LOC}/{SVC}"
    eventually(lambda: key in agent.errors())
    assert agent.errors()[key].startswith(error.__name__)
    info = eventually(lambda: [w for w in mgr.workers() if w.errors])[0]
    assert info.errors[key].startswith(error.__name__)
    assert mgr.wait_settled(LOC, SVC, timeout=10).services[SVC].state is State.PAUSED
    assert left == [0] and acked(mgr, "w1") == 1
    eventually(lambda: agent.errors() == {})
    assert mgr.pause(OTHER, SVC, wait=10).services[SVC].state is State.PAUSED  # still applying


def test_a_handler_raising_keyboard_interrupt_stops_the_agent_cleanly(
    kit: Kit, agents: list[Agent]
) -> None:
    """KeyboardInterrupt in a handler is a request to stop (docs/agent.md "Failures"): the
    agent unregisters, as stop() does, so it never blocks a pause it does not apply."""
    mgr = Client(kit.open())
    mgr.sync_locations([LOC])
    agent = mgr.agent("w1", services=[SVC], **FAST)
    agents.append(agent)

    @agent.on_pause(SVC)
    def stop(location: str) -> None:
        raise KeyboardInterrupt

    agent.start()
    assert [w.worker_id for w in mgr.workers()] == ["w1"]
    mgr.pause(LOC, SVC)
    eventually(lambda: mgr.workers() == [])
    assert mgr.wait_settled(LOC, SVC, timeout=10).services[SVC].state is State.PAUSED
    assert acked(mgr, "w1") is None


# -- what the worker publishes and fires ------------------------------------------------------


class Skewed(CallerClock):
    """The caller's clock, reporting a measured offset of +2.5 s to the backend."""

    def offset_seconds(self) -> float | None:
        return 2.5


def test_the_registration_carries_the_clock_offset(kit: Kit, agents: list[Agent]) -> None:
    plain = Client(kit.open()).agent("w-plain", services=[SVC], **FAST)
    skewed = Client(kit.open(), clock=Skewed(utcnow)).agent("w-skewed", services=[SVC], **FAST)
    agents.extend([plain, skewed])
    plain.start()
    skewed.start()
    mgr = Client(kit.open())
    offsets = {w.worker_id: w.clock_offset_seconds for w in mgr.workers()}
    assert offsets == {"w-plain": 0.0, "w-skewed": 2.5}


def test_an_agent_fires_only_the_resumes_of_the_services_it_applies(
    kit: Kit, agents: list[Agent]
) -> None:
    """An agent registered for lifecycle only must not fire a due replication resume
    (docs/agent.md "Scheduled resumes"); one that applies replication does."""
    clock = FakeClock()
    mgr = Client(kit.open(), clock=clock)
    mgr.sync_locations({LOC: [SVC, "lifecycle"]})
    mgr.pause(LOC, [SVC, "lifecycle"])  # no worker yet: settles at once
    mgr.resume(LOC, SVC, at=timedelta(hours=2))
    mgr.resume(LOC, "lifecycle", at=timedelta(hours=5))
    life = Client(kit.open(), clock=clock).agent(
        "w-life", services=["lifecycle"], resync_interval=0.2, settle_interval=0.1, **FAST
    )
    agents.append(life)
    life.start()
    clock.advance(hours=3)  # replication's resume is due, lifecycle's is not
    time.sleep(1.5)  # several passes of the agent's watch loop
    assert state(mgr) is State.PAUSED and state(mgr, service="lifecycle") is State.PAUSED
    repl = Client(kit.open(), clock=clock).agent(
        "w-repl", services=[SVC], resync_interval=0.2, settle_interval=0.1, **FAST
    )
    agents.append(repl)
    repl.start()
    eventually(lambda: state(mgr) is State.RUNNING)
    assert state(mgr, service="lifecycle") is State.PAUSED
    fired = [e for e in mgr.history(LOC, limit=10) if e.event == "resume_due"]
    assert [(e.service, e.actor) for e in fired] == [(SVC, "agent:w-repl")]
# -- corrupt records and purged locations ------------------------------------------------------


@pytest.mark.parametrize("kit", ["memory", "sqlite", "zk"], indirect=True)
def test_a_generation_past_64_bits_is_a_corrupt_record_not_an_overflow(
    kit: Kit, agents: list[Agent]
) -> None:
    """Before: a stored generation of 2**63 read as a record; the agent ran on_pause and its
    acknowledgement raised a raw OverflowError (SQLite), retried with a traceback for ever,
    with nothing in errors(). It is a corrupt record: reported, nothing run or acknowledged."""
    mgr = Client(kit.open())
    mgr.sync_locations([LOC])
    calls: list[str] = []
    agent = mgr.agent("w1", services=[SVC], resync_interval=0.3, **FAST)
    agents.append(agent)
    agent.on_pause(SVC)(lambda location: calls.append("pause"))
    agent.on_resume(SVC)(lambda location: calls.append("resume"))
    agent.start()
    assert calls == ["resume"]
    kit.write_raw(LOC, shapes.OUT_OF_RANGE["generation-2-63"])
    key = f"{LOC}/*"
    eventually(lambda: key in agent.errors())
    assert agent.errors()[key].startswith("CorruptRecord") and "generation" in agent.errors()[key]
    time.sleep(0.7)  # a couple more re-reads
    assert calls == ["resume"]
    assert agent.metrics()["backend_errors"] == 0 and agent.metrics()["thread_errors"] == 0
    assert acked(mgr, "w1") == 0


@pytest.mark.parametrize(
    "payload",
    [
        "{not json",
        '{"services": {"replication": {"state": "exploded", "generation": 9}}}',
        '{"services": {"replication": {}}}',  # does not say its state: never "running"
    ],
)
def test_a_corrupt_record_keeps_the_last_state_applied_and_is_reported(
    kit: Kit, agents: list[Agent], payload: str
) -> None:
    mgr = Client(kit.open())
    mgr.sync_locations([LOC, OTHER])
    calls: list[str] = []
    agent = mgr.agent("w1", services=[SVC], resync_interval=0.3, **FAST)
    agents.append(agent)
    agent.on_pause(SVC)(lambda location: calls.append(f"pause {location}"))
    agent.on_resume(SVC)(lambda location: calls.append(f"resume {location}"))
    agent.start()
    mgr.pause(LOC, SVC, wait=10)
    eventually(lambda: agent.state(LOC, SVC) is State.PAUSED)  # read the settled record
    good = mgr.status(LOC).model_dump_json(include={"services", "deleted_at"})
    before = list(calls)
    kit.write_raw(LOC, payload)
    key = f"{LOC}/*"
    eventually(lambda: key in agent.errors())
    assert agent.errors()[key].startswith("CorruptRecord")
    eventually(lambda: key in mgr.workers()[0].errors)  # published in the registration
    time.sleep(0.7)  # a couple more re-reads
    assert agent.is_paused(LOC, SVC) and agent.state(LOC, SVC) is State.PAUSED
    assert calls == before  # no handler ran for it
    assert agent.metrics()["corrupt_records"] >= 1
    assert mgr.pause(OTHER, SVC, wait=10).services[SVC].state is State.PAUSED  # others go on
    kit.write_raw(LOC, good)  # repaired by hand: reported no more
    eventually(lambda: key not in agent.errors())
    eventually(lambda: key not in mgr.workers()[0].errors)


def test_on_remove_runs_for_a_location_removed_and_purged_while_the_worker_was_cut_off(
    kit: Kit, agents: list[Agent]
) -> None:
    """A worker that misses both the removal and the purge (a freeze, a partition) still runs
    on_remove for the location it applied, when it finds it gone (before: it only forgot it)."""
    link = Partition(kit.open())
    mgr = Client(kit.open())
    mgr.sync_locations([LOC, OTHER])
    removed: list[str] = []
    agent = Client(link).agent("w1", services=[SVC], resync_interval=0.3, lease_seconds=60)
    agents.append(agent)
    agent.on_remove(removed.append)
    agent.start()
    assert agent.locations_seen() == sorted([LOC, OTHER])
    link.cut()
    mgr.sync_locations([OTHER])  # LOC becomes a tombstone ...
    mgr.purge_location(LOC, mgr.backend.read(LOC).version)  # ... and is purged
    link.heal()
    eventually(lambda: removed == [LOC])
    assert agent.locations_seen() == [OTHER]
    time.sleep(0.7)
    assert removed == [LOC]  # once


class HintsLost(Partition):
    """The real backend; while :meth:`cut`, only the hints are dropped (every call goes on):
    the worker misses what changes, and sees it only when it next reads."""

    def _check(self) -> None:
        pass


def _recording(agent: Agent, location: str) -> list[tuple[str, int | None]]:
    """Record (event, generation applied) of every handler call of ``agent`` at
    ``location``."""
    calls: list[tuple[str, int | None]] = []

    def handler(event: str) -> Callable[[str], None]:
        def run(loc: str) -> None:
            what = agent.applying
            assert what is not None
            if loc == location:
                calls.append((event, None if what.status is None else what.status.generation))

        return run

    agent.on_pause(SVC)(handler("pause"))
    agent.on_resume(SVC)(handler("resume"))
    agent.on_remove(handler("remove"))
    return calls


def test_a_location_created_again_while_the_worker_missed_it_is_a_new_location(
    kit: Kit, agents: list[Agent]
) -> None:
    """The protocol model's stale_applied finding (model/README.md): the worker applied and
    acknowledged a pause (generation 1), then missed the removal, the purge and the creation
    again, and a new pause comes at the same generation 1. Before: the agent compared
    generations only, took it as applied and never acknowledged it: pausing for good. Now the
    new record is a new location: on_remove for the old one, then on_pause, acknowledged."""
    link = HintsLost(kit.open())
    mgr = Client(kit.open())
    mgr.sync_locations([LOC, OTHER])
    agent = Client(link).agent("w1", services=[SVC], resync_interval=60, **FAST)
    agents.append(agent)
    calls = _recording(agent, LOC)
    agent.start()
    assert mgr.pause(LOC, SVC, wait=10).services[SVC].generation == 1
    eventually(lambda: agent.metrics()["resyncs"] >= 2)  # past the early re-read after start
    link.cut()
    mgr.sync_locations([OTHER])  # LOC removed ...
    mgr.purge_location(LOC, mgr.backend.read(LOC).version)  # ... purged ...
    mgr.sync_locations([LOC, OTHER])  # ... created again: running, generation 0 ...
    mgr.pause(LOC, SVC)  # ... and paused: generation 1 of the new location
    time.sleep(0.5)  # the hints of those writes are delivered, and lost, before the link heals
    link.heal()
    mgr.pause(LOC, "lifecycle")  # a write the worker hears of: it reads the record
    rec = mgr.wait_settled(LOC, SVC, timeout=10)
    assert rec.services[SVC].state is State.PAUSED and rec.services[SVC].generation == 1
    assert calls == [("resume", 0), ("pause", 1), ("remove", None), ("pause", 1)]
    assert acked(mgr, "w1") == 1 and agent.errors() == {}


def test_writes_missed_in_the_same_life_of_a_location_are_not_a_new_location(
    kit: Kit, agents: list[Agent]
) -> None:
    """The other side: writes the worker missed (a removal and restore included) are of the
    same record, which the backend's history tells: no on_remove, only what changed runs."""
    link = HintsLost(kit.open())
    mgr = Client(kit.open())
    mgr.sync_locations([LOC, OTHER])
    agent = Client(link).agent("w1", services=[SVC], resync_interval=60, **FAST)
    agents.append(agent)
    calls = _recording(agent, LOC)
    agent.start()
    mgr.pause(LOC, SVC, wait=10)
    eventually(lambda: agent.metrics()["resyncs"] >= 2)
    link.cut()
    mgr.resume(LOC, SVC)
    mgr.pause(LOC, SVC)
    mgr.sync_locations([OTHER])  # removed ...
    mgr.sync_locations([LOC, OTHER])  # ... and restored: the same record
    mgr.resume(LOC, SVC)
    time.sleep(0.5)  # the hints of those writes are delivered, and lost, before the link heals
    link.heal()
    mgr.pause(LOC, "lifecycle")  # a write the worker hears of: it reads the record
    rec = mgr.wait_settled(LOC, SVC, timeout=10)
    assert rec.services[SVC].state is State.RUNNING
    generation = rec.services[SVC].generation
    assert calls == [("resume", 0), ("pause", 1), ("resume", generation)]
    assert acked(mgr, "w1") == generation


# -- handlers of different locations run at once; a hung one is reported ---------------------


def test_a_hung_handler_on_one_location_does_not_stop_the_others_and_is_reported(
    kit: Kit, agents: list[Agent]
) -> None:
    """Before: the worker ran its handlers one at a time, so one hung on_pause kept every
    later pause anywhere ``pausing``, naming the worker but not where it was stuck."""
    mgr = Client(kit.open())
    mgr.sync_locations([LOC, OTHER, THIRD])
    gate = threading.Event()
    agent = mgr.agent("w1", services=[SVC], handler_deadline=0.5, **FAST)
    agents.append(agent)

    @agent.on_pause(SVC)
    def hang_at_us_east(location: str) -> None:
        if location == LOC:
            gate.wait(60)

    agent.start()
    try:
        mgr.pause(LOC, SVC)  # its handler hangs
        assert mgr.pause(OTHER, SVC, wait=10).services[SVC].state is State.PAUSED
        assert mgr.resume(OTHER, SVC, wait=10).services[SVC].state is State.RUNNING
        assert mgr.pause(THIRD, SVC, wait=10).services[SVC].state is State.PAUSED
        key = f"{LOC}/{SVC}"
        info = eventually(lambda: [w for w in mgr.workers() if key in w.stuck])[0]
        assert info.stuck[key].event == "pause"
        assert info.stuck[key].handler.endswith("hang_at_us_east")
        assert agent.metrics()["stuck"] == 1
        with pytest.raises(SettleTimeout) as err:
            mgr.wait_settled(LOC, SVC, timeout=0.5)
        assert err.value.lagging == ["w1"] and err.value.stuck == {"w1": [key]}
        assert f"pause handler {info.stuck[key].handler} at {key}" in str(err.value)
        # the check's human table and `locstatus workers` say where it is stuck
        console = Console(record=True, width=400)
        render_report(run_check(mgr, stuck_after=0.0), console)
        table = console.export_text()
        assert "stuck_transition" in table and "hang_at_us_east" in table
        shown = CliRunner().invoke(
            app, ["--backend", kit.url, "workers"], env={"COLUMNS": "400"}
        )
        assert shown.exit_code == 0 and "hang_at_us_east" in shown.stdout, shown.stdout
        listed = CliRunner().invoke(app, ["--backend", kit.url, "workers", "--json"])
        assert json.loads(listed.stdout)[0]["stuck"][key]["event"] == "pause"
    finally:
        gate.set()
    assert mgr.wait_settled(LOC, SVC, timeout=10).services[SVC].state is State.PAUSED
    eventually(lambda: mgr.workers()[0].stuck == {})
    assert agent.metrics()["stuck"] == 0


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_handler_hanging_at_start_holds_the_start_up_only_until_it_is_reported_stuck(
    kit: Kit, agents: list[Agent], concurrency: int
) -> None:
    """A new-user review: ``start()`` (and ``with agent:``) never returned when a handler due
    at start hung, while docs/agent.md says a hung handler does not keep the worker from
    applying the others. It returns once every other location's first pass ran and the hung
    one is reported stuck (with one apply thread, once that thread is stuck)."""
    mgr = Client(kit.open())
    mgr.sync_locations([LOC, OTHER, THIRD])
    for loc in (LOC, OTHER, THIRD):
        mgr.pause(loc, SVC)
    gate = threading.Event()
    applied: list[str] = []
    agent = mgr.agent(
        "w1", services=[SVC], handler_deadline=1.0, handler_concurrency=concurrency, **FAST
    )
    agents.append(agent)

    @agent.on_pause(SVC)
    def hang_at_us_east(location: str) -> None:
        if location == LOC:
            gate.wait(60)
        applied.append(location)

    returned = threading.Event()
    starter = threading.Thread(target=lambda: (agent.start(), returned.set()), daemon=True)
    began = time.monotonic()
    starter.start()
    try:
        assert returned.wait(15), "start() still waiting on the hung handler"
        took = time.monotonic() - began
        assert took >= 1.0  # not before the handler was reported stuck
        assert agent.metrics()["stuck"] == 1
        eventually(lambda: f"{LOC}/{SVC}" in mgr.workers()[0].stuck)
        if concurrency > 1:  # the others were applied before start returned
            assert sorted(applied) == sorted([OTHER, THIRD])
    finally:
        gate.set()
    eventually(lambda: sorted(applied) == sorted([LOC, OTHER, THIRD]))
    assert mgr.wait_settled(LOC, SVC, timeout=10).services[SVC].state is State.PAUSED


def test_handlers_of_one_location_run_one_at_a_time_and_of_different_locations_at_once(
    kit: Kit, agents: list[Agent]
) -> None:
    mgr = Client(kit.open())
    services = [SVC, "lifecycle"]
    mgr.sync_locations({LOC: services, OTHER: services, THIRD: services})
    agent = mgr.agent("w1", services=services, handler_concurrency=4, **FAST)
    agents.append(agent)
    lock = threading.Lock()
    active: dict[str, int] = {}
    peak = {"total": 0, LOC: 0, OTHER: 0, THIRD: 0}
    wrong: list[str] = []

    def slow(location: str) -> None:
        what = agent.applying
        if what is None or what.location != location:  # each handler sees its own
            wrong.append(f"{location}: {what}")
        with lock:
            active[location] = active.get(location, 0) + 1
            peak[location] = max(peak[location], active[location])
            peak["total"] = max(peak["total"], sum(active.values()))
        time.sleep(0.3)
        with lock:
            active[location] -= 1

    for svc in services:
        agent.on_pause(svc)(slow)
    agent.start()
    for loc in (LOC, OTHER, THIRD):
        mgr.pause(loc)  # both services of the location, one write
    for loc in (LOC, OTHER, THIRD):
        rec = mgr.wait_settled(loc, timeout=20)
        assert all(st.state is State.PAUSED for st in rec.services.values())
    assert peak[LOC] == peak[OTHER] == peak[THIRD] == 1  # one location: one at a time
    assert peak["total"] >= 2  # different locations: at once
    assert wrong == []
