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

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from locstatus import Manager, connect
from locstatus.agent.guard import Guard
from locstatus.agent.lease import Lease, lease_window
from locstatus.agent.queue import DueQueue
from locstatus.agent.replica import LocalCopy
from locstatus.agent.settle import (
    SETTLE_FALLBACK,
    SETTLE_JITTER,
    SETTLE_MAX_DELAY,
    SETTLE_QUIET,
    SETTLE_RETRIES,
    SettleSchedule,
    is_settler,
    rendezvous,
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
    assert lease.renew({}) == (True, False, False)
    backend.down = True
    mono.now += 3
    assert lease.renew({}) == (False, False, False) and not lease.connected
    backend.down = False
    mono.now += 3
    assert lease.renew({"x/replication": "boom"}) == (True, True, False)
    assert backend.inner.workers()[0].errors == {"x/replication": "boom"}
    mono.now += 10.5  # past the lease since the last success: it may have been dropped
    assert lease.renew({}) == (True, True, True)
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
    below = [root / "manager.py", root / "models.py", root / "clock.py", root / "errors.py"]
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
