"""The agent's parts on their own, on a fake clock (docs/agent.md, "How it is built").

Each part of ``locstatus/agent/`` that decides something without I/O is driven here directly:
the due-work queue (order, backoff, supersession), the settle schedule (debounce, settler
choice, retries, sweeps), the local copy (what work a record implies; property-tested), and the
lease (lapse and reconnection on the monotonic clock). The whole agent, threads and backends
included, is tests/test_agent.py.
"""

from __future__ import annotations

import ast
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from locstatus import Manager, connect
from locstatus.agent.fence import Fence
from locstatus.agent.guard import Guard
from locstatus.agent.lease import Lease, lease_window
from locstatus.agent.queue import DueQueue
from locstatus.agent.replica import Life, LocalCopy
from locstatus.agent.settle import (
    SETTLE_BACKUP,
    SETTLE_FALLBACK,
    SETTLE_JITTER,
    SETTLE_MAX_DELAY,
    SETTLE_QUIET,
    SETTLE_RETRIES,
    SettleSchedule,
    is_settler,
    rendezvous,
    settle_rank,
)
from locstatus.agent.state import AgentState, Running
from locstatus.backends import open_backend
from locstatus.clock import CallerClock
from locstatus.errors import BackendUnavailable, InvalidInput
from locstatus.models import (
    TOMBSTONE_ACK,
    LocationStatus,
    ServiceStatus,
    State,
    StuckHandler,
    WorkerInfo,
    utcnow,
)

A = ("us-east-1", "replication")
B = ("eu-west-1", "replication")
SERVICES = ("replication", "lifecycle")


class Monotonic:
    """A fake monotonic clock (seconds)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


# -- the due-work queue -----------------------------------------------------------------------


def test_queue_hands_out_keys_in_the_order_they_become_due() -> None:
    q = DueQueue()
    q.schedule(A, 1, now=10.0, delay=2.0)
    q.schedule(B, 1, now=10.0)
    assert q.next_at() == 10.0
    assert q.pop(now=10.0) == B
    assert q.pop(now=11.0) is None  # A is not due before 12
    assert q.next_at() == 12.0
    assert q.pop(now=12.0) == A
    assert q.pop(now=99.0) is None and q.next_at() is None and len(q) == 0


def test_queue_keeps_a_due_key_in_place_when_planned_again() -> None:
    q = DueQueue()
    assert q.schedule(A, 1, now=10.0)
    assert not q.schedule(A, 1, now=11.0)  # already due: keeps its place
    assert q.schedule(A, 1, now=11.0, delay=5.0)  # an explicit delay reschedules
    assert q.pop(now=12.0) is None and q.pop(now=16.0) == A


def test_queue_backoff_of_a_failing_generation_is_kept_but_a_newer_generation_is_due_now() -> None:
    q = DueQueue()
    assert q.failed(A, 3) == 1 and q.failed(A, 3) == 2
    q.schedule(A, 3, now=10.0, delay=30.0)  # backing off
    assert not q.schedule(A, 3, now=11.0)  # the same generation again keeps the backoff
    assert q.pop(now=11.0) is None
    assert q.schedule(A, 4, now=11.0)  # a newer generation does not wait for it
    assert q.pop(now=11.0) == A
    assert q.failed(A, 4) == 1  # another generation starts counting again
    q.succeeded(A)
    assert q.failed(A, 4) == 1


def test_queue_forgets_a_location_entirely() -> None:
    q = DueQueue()
    q.schedule(A, 1, now=10.0)
    q.schedule((A[0], TOMBSTONE_ACK), 7, now=10.0)
    q.schedule(B, 1, now=10.0, delay=1.0)
    q.failed(A, 1)
    q.discard_location(A[0])
    assert q.keys() == {B}
    assert q.pop(now=10.5) is None and q.pop(now=11.0) == B
    assert q.failed(A, 1) == 1  # the failure count went with it


def test_queue_parks_the_keys_of_a_busy_location_until_it_is_released() -> None:
    q = DueQueue()
    same = (A[0], "lifecycle")
    q.schedule(A, 1, now=10.0)
    q.schedule(same, 1, now=10.0)
    q.schedule(B, 1, now=10.0)
    assert q.pop(now=10.0) == A
    # A's location is busy: its other key waits, another location's goes first
    assert q.pop(now=10.0, busy={A[0]}) == B
    assert q.pop(now=10.0, busy={A[0]}) is None and q.next_at() is None and same in q
    q.release(A[0])
    assert q.next_at() == 10.0 and q.pop(now=10.0) == same


def test_a_forced_schedule_does_not_wait_for_a_backoff() -> None:
    q = DueQueue()
    q.schedule(A, 1, now=10.0, delay=30.0)
    assert not q.schedule(A, 1, now=10.0) and q.pop(now=10.0) is None
    assert q.schedule(A, 1, now=10.0, force=True) and q.pop(now=10.0) == A


# -- the settle schedule ----------------------------------------------------------------------


def test_settler_tries_after_the_quiet_period_within_its_bound() -> None:
    s = SettleSchedule(settle_interval=1.0, rng=random.Random(1))
    s.acknowledged("x", settler=True, now=100.0)
    assert s.pop_due(now=100.0) == set()
    at = s.next_at()
    assert at is not None and 100.0 + SETTLE_QUIET <= at <= 100.0 + SETTLE_QUIET + SETTLE_JITTER
    assert s.pop_due(now=at) == {"x"}
    assert s.pop_due(now=at) == set() and s.next_at() is None


def test_windows_opening_soon_after_an_open_one_are_tried_with_it_never_alone_early() -> None:
    """A burst's windows, jittered apart, are taken together once one is open (one batched
    settle); none is taken while none is open, and one further off waits its turn."""
    s = SettleSchedule(settle_interval=1.0, rng=random.Random(3))
    for i, loc in enumerate(["a", "b", "c"]):
        s.acknowledged(loc, settler=True, now=100.0 + i * 0.01)
    s.acknowledged("late", settler=False, now=100.0)  # the fallback: 0.5-1 s later
    assert s.pop_due(now=100.0, gather=0.1) == set()
    first = s.next_at()
    assert first is not None
    assert s.pop_due(now=first, gather=0.1) == {"a", "b", "c"}
    assert s.pop_due(now=first + 0.1, gather=0.1) == set()
    later = s.next_at()
    assert later is not None and later >= 100.0 + SETTLE_FALLBACK
    assert s.pop_due(now=later, gather=0.1) == {"late"}


def test_others_acknowledging_put_the_settle_off_but_never_past_the_bound() -> None:
    s = SettleSchedule(settle_interval=1.0, rng=random.Random(2))
    s.acknowledged("x", settler=True, now=100.0)
    now, popped_at = 100.0, None
    while popped_at is None:  # an acknowledgement hint every 5 ms
        now += 0.005
        s.others_acknowledged("x", now=now)
        if s.pop_due(now=now):
            popped_at = now
    assert 100.0 + SETTLE_MAX_DELAY <= popped_at <= 100.0 + SETTLE_MAX_DELAY + 0.0051
    s.others_acknowledged("x", now=now)  # the settler tries again after a later one
    at = s.next_at()
    assert at is not None and now + SETTLE_QUIET <= at <= now + SETTLE_QUIET + SETTLE_JITTER


def test_a_non_settler_only_falls_back_later() -> None:
    s = SettleSchedule(settle_interval=1.0, rng=random.Random(3))
    s.acknowledged("x", settler=False, now=100.0)
    at = s.next_at()
    assert at is not None and 100.0 + SETTLE_FALLBACK <= at <= 100.0 + 2 * SETTLE_FALLBACK
    s.others_acknowledged("x", now=100.1)  # bounded by its own window: not earlier, not later
    assert s.next_at() == at
    # Once its window closed, a non-settler ignores acknowledgement hints.
    assert s.pop_due(now=at) == {"x"}
    s.others_acknowledged("x", now=at)
    assert s.next_at() is None


def test_settle_retries_back_off_and_then_leave_it_to_the_safety_nets() -> None:
    s = SettleSchedule(settle_interval=1.0, rng=random.Random(4))
    now = 100.0
    s.acknowledged("x", settler=True, now=now)
    delays = []
    while True:
        at = s.next_at()
        assert at is not None
        now = at
        assert s.pop_due(now=now) == {"x"}
        if not s.still_transitional("x", now=now):
            break
        nxt = s.next_at()
        assert nxt is not None
        delays.append(nxt - now)
    assert len(delays) == SETTLE_RETRIES
    for tries, delay in enumerate(delays, 1):  # doubling from the quiet period, capped
        base = min(1.0, SETTLE_QUIET * 2**tries) + SETTLE_QUIET
        assert base <= delay <= base + SETTLE_JITTER
    s.acknowledged("x", settler=True, now=now)  # a new acknowledgement starts over
    assert s.pop_due(now=now + 1) == {"x"} and s.still_transitional("x", now=now + 1)


def test_a_pending_window_is_not_doubled_and_settled_stops_the_retries() -> None:
    s = SettleSchedule(settle_interval=1.0, rng=random.Random(5))
    s.acknowledged("x", settler=True, now=100.0)
    assert not s.still_transitional("x", now=100.0)  # a window is already pending
    assert s.pop_due(now=101.0) == {"x"}
    s.settled("x")
    s.others_acknowledged("x", now=101.0)  # no longer its settler: no new window
    assert s.next_at() is None


def test_failed_attempts_are_due_again_at_once() -> None:
    s = SettleSchedule(settle_interval=1.0)
    s.retry({"x", "y"}, now=50.0)
    assert s.pop_due(now=50.0) == {"x", "y"}


def test_sweeps_are_rate_limited_to_one_per_interval() -> None:
    s = SettleSchedule(settle_interval=1.0)
    assert not s.take_sweep(now=10.0)  # nobody asked
    s.request_sweep()
    assert s.next_at() == 0.0 and s.take_sweep(now=10.0)
    s.swept(now=10.0)
    s.request_sweep()
    assert not s.take_sweep(now=10.5) and s.next_at() == 11.0
    assert s.take_sweep(now=11.0) and not s.take_sweep(now=11.0)


@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=8, unique=True))
def test_exactly_one_live_worker_is_the_settler(ids: list[str]) -> None:
    winners = [w for w in ids if is_settler("us-east-1", w, ids)]
    assert winners == [max(ids, key=lambda w: rendezvous("us-east-1", w))]


def test_a_worker_counts_itself_when_its_registration_is_not_visible_yet() -> None:
    others = ["w1", "w2", "w3"]
    me = next(
        f"me{i}"
        for i in range(1000)
        if rendezvous("x", f"me{i}") > max(rendezvous("x", w) for w in others)
    )
    assert is_settler("x", me, others)  # counted though not listed
    assert not any(is_settler("x", w, [*others, me]) for w in others)


# -- the local copy ---------------------------------------------------------------------------


def record(location: str, version: int, **generations: int) -> LocationStatus:
    return LocationStatus(
        location=location,
        version=version,
        services={
            svc: ServiceStatus(state=State.PAUSED if g % 2 else State.RUNNING, generation=g)
            for svc, g in generations.items()
        },
    )


def test_store_plans_the_watched_services_whose_generation_was_not_applied() -> None:
    copy = LocalCopy(("replication",))
    assert copy.store(record("x", 1, replication=2, lifecycle=5)) == [(("x", "replication"), 2)]
    copy.applied[("x", "replication")] = 2
    assert copy.store(record("x", 2, replication=2)) == []
    assert copy.store(record("x", 3, replication=3)) == [(("x", "replication"), 3)]
    assert copy.store(record("x", 1, replication=9)) == []  # older than what is known
    assert copy.records["x"].version == 3


def test_a_tombstone_plans_its_removal_and_a_restore_plans_the_services_again() -> None:
    copy = LocalCopy(("replication",))
    copy.applied[("x", "replication")] = 2
    gone = record("x", 4, replication=2).model_copy(
        update={"deleted_at": datetime(2030, 1, 1, tzinfo=UTC)}
    )
    ((key, removal),) = copy.store(gone)
    assert key == ("x", TOMBSTONE_ACK) and removal > 0
    copy.applied[key] = removal
    copy.removed("x")  # on_remove ran: consumers torn down
    assert copy.store(gone.model_copy(update={"version": 5})) == []
    assert copy.store(record("x", 6, replication=2)) == [(("x", "replication"), 2)]
    assert ("x", TOMBSTONE_ACK) not in copy.applied


def test_forgetting_an_applied_location_makes_its_on_remove_due_once() -> None:
    copy = LocalCopy(("replication",))
    copy.store(record("x", 1, replication=0))
    copy.store(record("y", 1, replication=0))
    copy.touched.add("x")  # handlers ran for x; y was never applied
    assert copy.forget("x") and copy.purged == {"x"}
    assert not copy.forget("y") and copy.purged == {"x"}
    copy.touched.add("z")
    copy.removed("z")  # z's removal already ran on_remove
    assert not copy.forget("z")


def test_a_record_that_may_be_of_another_life_is_asked_about_before_it_is_stored() -> None:
    """LocalCopy.life_check (the model's stale_applied finding): only a version that cannot
    follow the held one within a life, at a location where something was applied."""
    copy = LocalCopy(("replication",))
    copy.store(record("x", 5, replication=1))
    assert copy.life_check(record("x", 9, replication=1)) is None  # nothing applied there
    copy.applied[("x", "replication")] = 1
    assert copy.life_check(record("x", 6, replication=1)) is None  # the next write
    assert copy.life_check(record("x", 5, replication=1)) is None  # not newer
    assert copy.life_check(record("x", 7, replication=1)) == 5  # writes were missed
    gone = record("x", 6, replication=1).model_copy(
        update={"deleted_at": datetime(2030, 1, 1, tzinfo=UTC)}
    )
    copy.store(gone)
    assert copy.life_check(record("x", 7, replication=1)) == 6  # after a tombstone
    assert copy.life_check(record("y", 1, replication=0)) is None  # not held


def test_storing_a_new_life_runs_on_remove_for_the_old_one_before_applying_the_new() -> None:
    mono = Monotonic()
    state = AgentState(("replication",), 1.0, monotonic=mono)
    loc = A[0]
    with state.cond:  # the *_locked methods expect the lock held
        state.store_locked(record(loc, 5, replication=1))
        state.queue.pop(now=mono.now)
        state.copy.applied[A] = 1
        state.copy.touched.add(loc)
        reborn = record(loc, (1 << 20) | 2, replication=1)
        assert not state.store_locked(reborn)  # not asked yet: left to the watch thread
        assert state.dirty == {loc} and state.copy.records[loc].version == 5
        assert not state.store_locked(reborn, {loc: Life(4, False)})  # asked about another
        assert state.store_locked(reborn, {loc: Life(5, False)})
        assert state.copy.records[loc] == reborn and A not in state.copy.applied
        assert state.copy.purged == {loc}
        assert state.queue.keys() == {(loc, TOMBSTONE_ACK)}  # on_remove first, nothing else
        state.copy.purged.discard(loc)  # on_remove ran (Applier._apply_purge) ...
        state.copy.removed(loc)
        assert state.store_locked(reborn)  # ... and it is stored again: same version, no ask
        assert state.queue.keys() == {(loc, TOMBSTONE_ACK), A}


def test_a_record_whose_life_cannot_be_told_is_applied_again() -> None:
    mono = Monotonic()
    state = AgentState(("replication",), 1.0, monotonic=mono)
    with state.cond:
        state.store_locked(record(A[0], 5, replication=1))
        state.queue.pop(now=mono.now)
        state.copy.applied[A] = 1
        later = record(A[0], 9, replication=1)
        assert state.store_locked(later, {A[0]: Life(5, None)})
        assert state.queue.keys() == {A} and not state.copy.purged  # handlers again, no remove
        state.queue.pop(now=mono.now)
        state.copy.applied[A] = 1
        assert state.store_locked(record(A[0], 12, replication=1), {A[0]: Life(9, True)})
        assert state.queue.keys() == set()  # the same life: nothing to do


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["x", "y"]),
            st.integers(0, 6),
            st.integers(0, 4),
            st.integers(0, 4),
            st.booleans(),
        ),
        max_size=30,
    )
)
def test_the_copy_keeps_the_newest_record_and_plans_exactly_what_differs(
    steps: list[tuple[str, int, int, int, bool]],
) -> None:
    copy = LocalCopy(SERVICES)
    newest: dict[str, LocationStatus] = {}
    for loc, version, g_repl, g_life, apply_it in steps:
        rec = record(loc, version, replication=g_repl, lifecycle=g_life)
        work = copy.store(rec)
        if loc not in newest or newest[loc].version <= version:
            newest[loc] = rec
            expected = [
                ((loc, svc), g)
                for svc, g in (("replication", g_repl), ("lifecycle", g_life))
                if copy.applied.get((loc, svc)) != g
            ]
            assert work == expected
        else:
            assert work == []
        assert copy.records == newest
        if apply_it:
            for key, generation in work:
                copy.applied[key] = generation
    applied = dict(copy.applied)
    copy.acknowledge_again()
    assert copy.applied == {} and all(copy.handled[k] == g for k, g in applied.items())


def test_the_guard_reports_a_handler_past_its_deadline_once() -> None:
    mono = Monotonic()
    state = AgentState(("replication",), 1.0, monotonic=mono)
    guard = Guard(state, "w1", deadline=5.0)
    since = datetime(2030, 1, 1, tzinfo=UTC)
    state.running[A] = Running(mono.now, since, "pause", "mod.stop")
    assert guard.next_deadline() == mono.now + 5.0
    mono.now += 4.9
    guard.check()
    assert state.stuck_locked() == {} and not state.beat_now.is_set()
    mono.now += 0.2
    guard.check()
    assert state.stuck_locked() == {
        "us-east-1/replication": StuckHandler(event="pause", handler="mod.stop", since=since)
    }
    assert state.beat_now.is_set() and state.metrics["stuck_handlers"] == 1
    guard.check()
    assert state.metrics["stuck_handlers"] == 1 and guard.next_deadline() is None


def test_the_guard_fences_when_the_lease_runs_out_by_the_monotonic_clock() -> None:
    mono = Monotonic()
    state = AgentState(("replication",), 1.0, monotonic=mono)
    lapsed: list[float] = []
    until = mono.now + 3.0
    guard = Guard(
        state,
        "w1",
        deadline=60.0,
        lease_until=lambda: until,
        on_lapse=lambda: lapsed.append(mono.now),
    )
    assert guard.next_deadline() == until
    guard.check()
    assert lapsed == []
    mono.now = until
    guard.check()
    assert lapsed == [until]


# -- the self-fence ----------------------------------------------------------------------------


def test_the_fence_lifts_only_when_the_lease_is_back_its_keys_stopped_and_records_read() -> None:
    """The three conditions of locstatus/agent/fence.py, each missing in turn (the model's
    early_unfence variant lifted it at the first renewal)."""
    fence = Fence()
    assert fence.impose("no renewal landed", {A, B}) and fence.fenced
    assert not fence.impose("again", set())  # fenced already: nothing changes
    assert fence.to_stop == {A, B}
    assert fence.reread_token() is None  # a re-read before the lease is back does not count
    assert fence.lease_back(110.0, now=100.0) and fence.returning
    assert not fence.lease_back(111.0, now=100.5)  # the same return, renewed again
    token = fence.reread_token()
    fence.reread_done(token)
    assert not fence.ready(now=101.0)  # A and B still to stop
    fence.stopped(A)
    assert fence.gone(B[0], on_remove=True) and not fence.gone(B[0], on_remove=True)  # purged
    assert not fence.ready(now=101.0)  # its on_remove is only queued: its consumers still run
    fence.removed(B[0])
    assert fence.ready(now=101.0)
    assert not fence.ready(now=111.0)  # the lease ran out again meanwhile
    fence.lift()
    assert not fence.fenced and not fence.returning and not fence.ready(now=101.0)


def test_a_location_gone_while_fenced_holds_the_fence_until_its_on_remove_returned() -> None:
    """The hostile review's freeze across a removal: the fence lifted once the purged
    location's on_remove was queued, ~70 ms before anything stopped its consumers."""
    fence = Fence()
    fence.impose("no renewal landed", {A}, removals={"gone-before"})
    fence.lease_back(110.0, now=100.0)
    fence.reread_done(fence.reread_token())
    assert fence.gone(A[0], on_remove=True)
    assert not fence.ready(now=101.0)
    fence.removed(A[0])
    assert not fence.ready(now=101.0)  # purged before the fence, its on_remove still due
    fence.removed("gone-before")
    assert fence.ready(now=101.0)
    # a location where nothing ran (no on_remove due) does not hold the fence
    fence = Fence()
    fence.impose("no renewal landed", {B})
    fence.lease_back(110.0, now=100.0)
    fence.reread_done(fence.reread_token())
    assert fence.gone(B[0], on_remove=False) and fence.ready(now=101.0)


def test_a_re_read_counts_only_for_the_return_it_started_in() -> None:
    fence = Fence()
    fence.impose("session lost", set())
    fence.lease_back(105.0, now=100.0)
    early = fence.reread_token()
    fence.reread_done(early)
    assert fence.ready(now=101.0)
    # the renewals fail again until the lease ran out: a new return, a new re-read needed
    assert fence.lease_back(120.0, now=106.0)
    assert not fence.ready(now=107.0)
    stale = early
    fence.reread_done(stale)
    assert not fence.ready(now=107.0)
    started = fence.reread_token()
    assert fence.lease_back(130.0, now=121.0)  # ran out again while that re-read ran
    fence.reread_done(started)
    assert not fence.ready(now=122.0)
    fence.reread_done(fence.reread_token())
    assert fence.ready(now=122.0)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("impose"), st.sets(st.sampled_from([A, B]), max_size=1)),
            st.tuples(st.just("stopped"), st.sampled_from([A, B])),
            st.tuples(st.just("renewed"), st.floats(0.5, 6.0)),
            st.tuples(st.just("reread_start"), st.just(0)),
            st.tuples(st.just("reread_end"), st.integers(0, 3)),
            st.tuples(st.just("tick"), st.floats(0.0, 2.0)),
            st.tuples(st.just("lift"), st.just(0)),
        ),
        min_size=4,
        max_size=40,
    )
)
def test_the_fence_is_ready_exactly_when_its_history_says_so(
    steps: list[tuple[str, Any]],
) -> None:
    """The rules restated over the history of events: ready at ``now`` iff fenced, every key
    imposed was stopped since, the last renewal's lease end is ahead, and a re-read that
    started after the current return began (the first renewal since the fence, or the first
    after the lease ran out again) has completed."""
    fence = Fence()
    now = 0.0
    imposed_at: int | None = None  # index of the impose of the current fence
    keys: set[tuple[str, str]] = set()
    renewals: list[tuple[int, float, float]] = []  # (index, at, until) since the fence
    rereads: list[tuple[int, int | None]] = []  # (index started, token)
    done: list[tuple[int, int]] = []  # (index started, index completed)
    for i, (kind, arg) in enumerate(steps):
        if kind == "impose":
            if fence.impose("r", arg):
                imposed_at, keys, renewals, done = i, set(arg), [], []
        elif kind == "stopped":
            fence.stopped(arg)
            keys.discard(arg)
        elif kind == "renewed":
            if imposed_at is not None:
                renewals.append((i, now, now + arg))
            fence.lease_back(now + arg, now=now)
        elif kind == "reread_start":
            rereads.append((i, fence.reread_token()))
        elif kind == "reread_end" and rereads:
            started, token = rereads.pop(arg % len(rereads))
            fence.reread_done(token)
            done.append((started, i))
        elif kind == "tick":
            now += arg
        elif kind == "lift" and fence.ready(now=now):
            fence.lift()
            imposed_at = None
        # the current return began at the last renewal that found no lease holding
        begun = None
        for j, (idx, at, _) in enumerate(renewals):
            if j == 0 or at >= renewals[j - 1][2]:
                begun = idx
        expected = (
            imposed_at is not None
            and not keys
            and bool(renewals)
            and now < renewals[-1][2]
            and begun is not None
            and any(started > begun for started, _ in done)
        )
        assert fence.ready(now=now) == expected, (i, kind)


def test_lifting_the_fence_applies_the_state_read_again_except_where_it_is_corrupt() -> None:
    mono = Monotonic()
    state = AgentState(("replication",), 1.0, monotonic=mono)
    with state.cond:  # the *_locked methods expect the lock held
        for loc in (A[0], B[0]):
            state.store_locked(record(loc, 3, replication=1))
            state.copy.applied[(loc, "replication")] = 1
            state.copy.running.add((loc, "replication"))
        while state.queue.pop(now=mono.now) is not None:
            pass
        assert state.fence_locked("no renewal landed") and state.metrics["fences"] == 1
        assert state.fence.to_stop == {A, B} and state.queue.keys() == {A, B}  # to be stopped
        for key in (A, B):
            state.queue.pop(now=mono.now)
            state.fence.stopped(key)
            state.copy.stopped(key)
        state.errors[f"{B[0]}/*"] = "CorruptRecord: ..."
        assert not state.lease_back_locked(mono.now + 5.0)  # not read again yet
        assert state.want_resync
        state.fence.reread_done(state.fence.reread_token())
        assert state.try_unfence_locked() and not state.fence.fenced
        assert state.queue.keys() == {A}  # on_resume again at A; nothing for corrupt B


# -- the lease --------------------------------------------------------------------------------


class FlakyWorkers:
    """A memory backend whose worker writes fail while ``down``."""

    def __init__(self) -> None:
        self.inner = open_backend("memory://")
        self.down = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def put_worker(self, info: WorkerInfo) -> None:
        if self.down:
            raise BackendUnavailable("down")
        self.inner.put_worker(info)


def test_lease_renewals_report_failures_reconnection_and_lapses_on_the_monotonic_clock() -> None:
    backend = FlakyWorkers()
    mgr = Manager(backend)  # type: ignore[arg-type]
    mono = Monotonic()
    lease = Lease(mgr, "w1", ("replication",), None, lease_seconds=10.0, monotonic=mono)
    lease.register({})
    assert [w.worker_id for w in backend.inner.workers()] == ["w1"]
    mono.now += 3
    assert lease.renew({}) == (True, False, False, False)
    backend.down = True
    mono.now += 3
    assert lease.renew({}) == (False, False, False, False) and not lease.connected
    backend.down = False
    mono.now += 3
    assert lease.renew({"x/replication": "boom"}) == (True, True, False, False)
    assert backend.inner.workers()[0].errors == {"x/replication": "boom"}
    mono.now += 10.5  # past the lease since the last success: it may have been dropped
    assert lease.renew({}) == (True, True, True, False)
    lease.unregister()
    assert backend.inner.workers() == []


def test_lease_refuses_to_register_on_a_backend_that_is_down() -> None:
    backend = FlakyWorkers()
    backend.down = True
    lease = Lease(Manager(backend), "w1", ("replication",), None, lease_seconds=10.0)  # type: ignore[arg-type]
    with pytest.raises(BackendUnavailable):
        lease.register({})


class Uncertain(CallerClock):
    def uncertainty_seconds(self) -> float:
        return 0.4


def test_the_lease_holds_from_when_the_renewal_was_sent_less_margin_and_uncertainty() -> None:
    backend = FlakyWorkers()
    mono = Monotonic()
    lease = Lease(
        Manager(backend, clock=Uncertain(utcnow)),  # type: ignore[arg-type]
        "w1",
        ("replication",),
        None,
        lease_seconds=10.0,
        margin=2.5,
        monotonic=mono,
    )
    assert lease.good_until is None
    lease.register({})
    assert lease.good_until == pytest.approx(1000.0 + 10 - 2.5 - 0.4)
    mono.now += 3
    assert lease.renew({}).ok and lease.good_until == pytest.approx(1003.0 + 7.1)
    backend.down = True
    mono.now += 3
    assert not lease.renew({}).ok and lease.good_until == pytest.approx(1010.1)  # unchanged


def test_the_lease_window_is_the_session_timeout_where_sessions_are_leases() -> None:
    class Sessions:
        session_leases = True
        session_timeout = 4.0

    class Heartbeats:
        session_leases = False
        session_timeout = None

    assert lease_window(Sessions(), 30.0) == 4.0
    assert lease_window(Heartbeats(), 30.0) == 30.0


def test_a_fence_margin_that_leaves_no_room_for_renewals_is_refused() -> None:
    mgr = connect("memory://")
    agent = mgr.agent("w1", lease_seconds=9.0)  # renewals every 3 s: margin min(2.25, 3)
    assert agent.fence_margin == 2.25 and agent.renew_interval == 3.0
    assert mgr.agent("w1", lease_seconds=1.0, heartbeat_interval=0.9).fence_margin == pytest.approx(
        0.05
    )
    for bad in (0.0, -1.0, 6.0, 7.5):
        with pytest.raises(InvalidInput, match="fence_margin"):
            mgr.agent("w1", lease_seconds=9.0, fence_margin=bad)


# -- layering ---------------------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_manager_and_the_layers_below_it_never_import_the_agent() -> None:
    """The agent sits above the manager (docs/agent.md): not even a deferred import back."""
    root = Path(__file__).resolve().parent.parent / "locstatus"
    below = [root / "models.py", root / "clock.py", root / "errors.py"]
    below += [*(root / "manager").rglob("*.py")]
    below += [*(root / "backends").rglob("*.py"), *(root / "fsm").rglob("*.py")]
    for path in below:
        upward = {
            n for n in _imports(path) if n.startswith(("locstatus.agent", "locstatus.client"))
        }
        assert not upward, f"{path.relative_to(root)} imports {sorted(upward)}"


def test_connect_returns_a_manager_that_makes_agents() -> None:
    mgr = connect("memory://")
    assert isinstance(mgr, Manager)
    agent = mgr.agent("w1", services=["crr"], lease_seconds=5)
    assert agent.services == ("replication",) and agent.lease_seconds == 5


@pytest.mark.parametrize(
    "setting",
    [
        {"handler_concurrency": 0},
        {"handler_concurrency": 257},
        {"handler_concurrency": True},
        {"handler_concurrency": "4"},
        {"handler_deadline": 0},
        {"handler_deadline": float("nan")},
        {"handler_deadline": "60"},
        {"fence_margin": "1"},
        {"fence_margin": float("nan")},
    ],
)
def test_bad_agent_settings_are_refused_by_name(setting: dict[str, object]) -> None:
    (name,) = setting
    with pytest.raises(InvalidInput, match=name):
        connect("memory://").agent("w1", **setting)  # type: ignore[arg-type]


def test_a_non_settler_tries_once_and_leaves_the_retries_to_the_settler() -> None:
    """A burst's 15 non-settlers retrying every location with backoff were most of the
    fleet's settle attempts: a non-settler's fallback is one attempt (the last worker to
    acknowledge finds every acknowledgement in); the settler still retries."""
    s = SettleSchedule(settle_interval=1.0, rng=random.Random(6))
    s.acknowledged("x", settler=False, now=100.0)
    s.acknowledged("y", settler=True, now=100.0)
    assert s.pop_due(now=100.0 + 2 * SETTLE_FALLBACK) == {"x", "y"}
    assert not s.still_transitional("x", now=105.0)
    assert s.still_transitional("y", now=105.0)
    assert s.pop_due(now=107.0) == {"y"}


def test_the_backup_falls_back_early_and_retries_and_ranks_are_the_rendezvous_order() -> None:
    """The worker ranked second for a location (its backup) covers a settler that died right
    after acknowledging: it tries 0.5-1 s after its acknowledgement and again with backoff;
    the ranks are the rendezvous order, one settler and one backup per location."""
    ids = [f"w{i}" for i in range(6)]
    ranks = sorted(settle_rank("x", w, ids) for w in ids)
    assert ranks == list(range(6))
    assert [w for w in ids if settle_rank("x", w, ids) == 0] == [
        w for w in ids if is_settler("x", w, ids)
    ]
    s = SettleSchedule(settle_interval=1.0, rng=random.Random(7))
    s.acknowledged("x", settler=False, backup=True, now=100.0)
    at = s.next_at()
    assert at is not None and 100.0 + SETTLE_BACKUP <= at <= 100.0 + 2 * SETTLE_BACKUP
    assert s.pop_due(now=at) == {"x"}
    assert s.still_transitional("x", now=at)
