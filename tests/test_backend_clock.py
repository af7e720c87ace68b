"""The measuring time source (``locstatus/backend_clock.py``, docs/time.md) against a scripted
store: its clock, this host's clocks and every round trip are chosen by the test, so the
guarantee is checked exactly: a deadline is judged past only once it has passed by the store's
own time, whatever this host's wall clock says, and nothing is judged while the bound cannot
be met.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from locstatus.backend_clock import DRIFT, BackendClock, time_source_for
from locstatus.backends.memory import MemoryBackend
from locstatus.clock import CallerClock
from locstatus.errors import BackendUnavailable, InvalidInput

EPOCH = datetime(2030, 1, 1, tzinfo=UTC)


class World:
    """One process and one store. ``mono`` is this process's monotonic clock, ``wall`` its
    wall clock (``skew`` seconds off the store's); the store's clock runs ``rate`` times as fast
    as the monotonic one. A probe takes ``rtt`` seconds, the store stamping it ``split`` of the
    way through."""

    def __init__(self, *, skew: float = 0.0, rate: float = 1.0) -> None:
        self.mono = 1000.0
        self.skew = skew
        self.rate = rate
        self.rtt = 0.002
        self.split = 0.5
        self.down = False
        self.probes = 0
        self.url = "scripted://store"
        self.clock_resolution = 0.001

    def store_time(self) -> datetime:
        return EPOCH + timedelta(seconds=(self.mono - 1000.0) * self.rate)

    def wall(self) -> float:
        return self.store_time().timestamp() + self.skew

    def monotonic(self) -> float:
        return self.mono

    def probe_time(self) -> datetime:
        self.probes += 1
        if self.down:
            self.mono += self.rtt
            raise BackendUnavailable("scripted store is down")
        self.mono += self.rtt * self.split
        stamp = self.store_time()
        self.mono += self.rtt * (1 - self.split)
        # the stamp's resolution: truncated to milliseconds, as ZooKeeper and MongoDB do
        return stamp.replace(microsecond=stamp.microsecond // 1000 * 1000)

    def advance(self, seconds: float) -> None:
        self.mono += seconds


def source(world: World, **kw: float) -> BackendClock:
    return BackendClock(world, monotonic=world.monotonic, wall=world.wall, **kw)  # type: ignore[arg-type]


def test_now_is_the_stores_time_whatever_this_hosts_wall_clock_says() -> None:
    world = World(skew=3 * 3600)  # this host is 3 h ahead
    ts = source(world)
    assert abs((ts.now() - world.store_time()).total_seconds()) <= ts.uncertainty_seconds()
    assert ts.offset_seconds() == pytest.approx(3 * 3600, abs=0.01)
    world.advance(2.0)  # no probe: carried forward on the monotonic clock
    assert abs((ts.now() - world.store_time()).total_seconds()) <= ts.uncertainty_seconds()
    assert world.probes == 1


def test_a_deadline_is_past_only_once_the_stores_time_reached_it() -> None:
    world = World(skew=30.0)
    ts = source(world)
    deadline = world.store_time() + timedelta(seconds=10)
    assert not ts.is_past(deadline)
    world.advance(9.99)
    assert not ts.is_past(deadline)
    world.advance(0.1)
    assert ts.is_past(deadline)
    assert ts.refusals == 0


def test_probes_are_periodic_not_one_per_decision() -> None:
    world = World()
    ts = source(world, probe_interval=5.0)
    far = world.store_time() + timedelta(hours=1)
    for _ in range(1000):
        ts.now()
        ts.is_past(far)
        world.advance(0.001)
    assert world.probes == 1
    world.advance(5.0)
    ts.now()
    assert world.probes == 2


def test_a_deadline_inside_the_uncertainty_is_decided_by_a_fresh_probe() -> None:
    world = World()
    world.rtt = 0.2  # first probe: +-0.1 s
    ts = source(world)
    ts.probe()
    deadline = world.store_time() + timedelta(seconds=1)
    world.advance(1.05)  # past by the store's clock, but not beyond +-0.1 s
    world.rtt = 0.002
    assert ts.is_past(deadline)  # a second probe (tighter) decided it
    assert world.probes == 2


def test_an_uncertainty_above_the_bound_refuses_every_deadline_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = World()
    world.rtt = 2.0  # +-1 s: above the 0.25 s bound, every time
    ts = source(world, max_uncertainty=0.25)
    long_ago = world.store_time() - timedelta(hours=1)
    with caplog.at_level(logging.WARNING, logger="locstatus.clock"):
        assert not ts.is_past(long_ago)
        assert not ts.is_past(long_ago)
    assert ts.refusals == 2
    problem = ts.problem()
    assert problem is not None and "above the 0.25s bound" in problem
    assert sum("refusing to act on a deadline" in r.message for r in caplog.records) == 1
    # a deadline that cannot have passed yet is no refusal: nothing to decide
    assert not ts.is_past(world.store_time() + timedelta(hours=1))
    assert ts.refusals == 2
    world.rtt = 0.002
    world.advance(1.0)
    assert ts.is_past(long_ago)
    assert ts.problem() is None


def test_no_answer_ever_means_no_time_and_no_decision() -> None:
    world = World()
    world.down = True
    ts = source(world)
    with pytest.raises(BackendUnavailable, match="cannot read the time of scripted://store"):
        ts.now()
    assert not ts.is_past(EPOCH - timedelta(days=1))
    assert ts.refusals == 1
    assert ts.offset_seconds() is None
    assert "backend time unknown" in (ts.problem() or "")


def test_a_store_that_stops_answering_leaves_the_estimate_growing_uncertain() -> None:
    world = World()
    ts = source(world, probe_interval=1.0, max_uncertainty=0.25)
    ts.probe()
    start = ts.uncertainty_seconds()
    world.down = True
    world.advance(100.0)
    assert ts.now() is not None  # carried forward, never this host's wall clock
    assert ts.uncertainty_seconds() == pytest.approx(start + DRIFT * 100.0, abs=0.01)
    assert ts.is_past(world.store_time() - timedelta(seconds=1))  # +-0.1 s: still decided
    world.advance(200.0)  # 0.3 s of drift allowance: above the 0.25 s bound
    assert not ts.is_past(world.store_time() - timedelta(hours=1))
    assert ts.refusals >= 1 and "last probe failed" in (ts.problem() or "")


def test_a_tighter_estimate_is_not_replaced_by_a_slower_probe() -> None:
    world = World()
    ts = source(world, probe_interval=1.0)
    ts.probe()
    world.advance(1.0)
    world.rtt = 0.4  # a slow probe: +-0.2 s, worse than the aged first one
    ts.now()
    assert world.probes == 2
    assert ts.uncertainty_seconds() < 0.05


@settings(max_examples=300, deadline=None)
@given(
    skew=st.floats(-86_400, 86_400),
    rate=st.floats(1 - DRIFT / 2, 1 + DRIFT / 2),
    rtts=st.lists(st.floats(0.0, 0.3), min_size=1, max_size=8),
    splits=st.lists(st.floats(0.0, 1.0), min_size=8, max_size=8),
    steps=st.lists(st.floats(0.0, 4.0), min_size=1, max_size=8),
    aheads=st.lists(st.floats(-0.5, 0.5), min_size=8, max_size=8),
)
def test_never_judged_past_early_whatever_the_skew_drift_and_round_trips(
    skew: float, rate: float, rtts: list[float], splits: list[float], steps: list[float],
    aheads: list[float],
) -> None:
    """The guarantee of docs/time.md as a property: with any host skew, any round trips
    (stamped anywhere inside them) and a store clock drifting within the allowance, a deadline
    judged past has passed by the store's own time, and ``now()`` is within the stated bound."""
    world = World(skew=skew, rate=rate)
    ts = source(world, probe_interval=2.0, max_uncertainty=1.0)
    for i, step in enumerate(steps):
        world.rtt = rtts[i % len(rtts)]
        world.split = splits[i]
        world.advance(step)
        deadline = world.store_time() + timedelta(seconds=aheads[i])
        past = ts.is_past(deadline)
        assert not past or world.store_time() >= deadline
        error = abs((ts.now() - world.store_time()).total_seconds())
        assert error <= ts.uncertainty_seconds() + 1e-6


def test_bad_settings_are_refused() -> None:
    with pytest.raises(InvalidInput, match="probe_interval"):
        BackendClock(MemoryBackend(), probe_interval=0)
    with pytest.raises(InvalidInput, match="max_uncertainty"):
        BackendClock(MemoryBackend(), max_uncertainty=float("nan"))


def test_an_in_process_store_is_its_own_exact_clock() -> None:
    ts = time_source_for(MemoryBackend())
    assert isinstance(ts, CallerClock)
    assert ts.uncertainty_seconds() == 0.0 and ts.offset_seconds() == 0.0
