"""The ZooKeeper watcher's state machine (``locstatus/backends/zookeeper/session.py``), driven
without a server: each test hands a round fake events and fake outcomes and reads the steps it
yields, in order. The orderings are the ones the module docstring states; the real watcher
performs the same steps against a real ensemble in ``tests/test_zk_backend.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from locstatus.backends.zookeeper import Layout
from locstatus.backends.zookeeper.session import (
    ArmAll,
    AwaitReads,
    AwaitRearm,
    Connection,
    Deliver,
    Event,
    Fired,
    ListLocations,
    Ready,
    Rearm,
    Restore,
    Send,
    Step,
    WatchMachine,
)
from locstatus.models import Hint

PATHS = Layout("/locstatus")
LOC_A = f"{PATHS.locations}/a"
ACKS_A = f"{PATHS.acks_root}/a"


@dataclass
class Server:
    """Fake outcomes: what each step's I/O answers (True/names: it worked)."""

    names: list[str] = field(default_factory=lambda: ["a", "b"])
    restore: bool = True
    arm: bool = True
    send: bool = True
    reads_fail: bool = False
    rearm: bool = True
    _reads: tuple[str, ...] = ()

    def answer(self, step: Step) -> Any:
        match step:
            case Restore():
                return self.restore
            case ArmAll():
                return list(self.names) if self.arm else None
            case ListLocations():
                return list(self.names) if self.arm else None
            case Rearm():
                return self.rearm
            case Send(reads, _):
                self._reads = reads
                return self.send, self.send
            case AwaitReads():
                reads, self._reads = self._reads, ()
                return [(p.rpartition("/")[2], None) for p in reads], self.reads_fail
            case AwaitRearm():
                return self.rearm
        return None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(
    machine: WatchMachine,
    events: Sequence[Event] = (),
    server: Server | None = None,
    *,
    live: bool = True,
    subscribed: bool = True,
    wants_acks: bool = False,
) -> list[Step]:
    """Drive one round to its end; the steps it yielded, in order."""
    server = server or Server()
    rnd = machine.round(
        events, live=lambda: live, subscribed=lambda: subscribed, wants_acks=lambda: wants_acks
    )
    steps: list[Step] = []
    outcome: Any = None
    while True:
        try:
            step = rnd.send(outcome)
        except StopIteration:
            return steps
        steps.append(step)
        outcome = server.answer(step)


def delivered(steps: Sequence[Step]) -> list[Hint]:
    return [h for s in steps if isinstance(s, Deliver) for h in s.hints]


def index(steps: Sequence[Step], kind: type | Callable[[Step], bool]) -> int:
    test = kind if not isinstance(kind, type) else (lambda s: isinstance(s, kind))
    return next(i for i, s in enumerate(steps) if test(s))


def armed(machine: WatchMachine, *, wants_acks: bool = False) -> WatchMachine:
    run(machine, [Connection(1)], wants_acks=wants_acks)
    assert machine.armed
    return machine


# -- connections and sessions ------------------------------------------------------------------


def test_the_first_connection_arms_every_watch_and_hints_nothing() -> None:
    machine = WatchMachine(PATHS)
    steps = run(machine, [Connection(1)])
    assert steps == [Ready(armed=False), ArmAll(acks=False), Ready(armed=True)]
    assert machine.armed and machine.watched == {"a", "b"}


def test_a_reconnection_to_the_same_session_rearms_then_hints_resync() -> None:
    machine = armed(WatchMachine(PATHS))
    steps = run(machine, [Connection(None), Connection(1)])
    assert index(steps, ArmAll) < index(steps, Deliver)
    assert delivered(steps) == [Hint(kind="resync", session_lost=False)]
    assert not any(isinstance(s, Restore) for s in steps)


def test_a_new_session_puts_registrations_back_before_arming_and_says_session_lost() -> None:
    machine = armed(WatchMachine(PATHS))
    steps = run(machine, [Connection(2)])
    assert index(steps, Restore) < index(steps, ArmAll) < index(steps, Deliver)
    assert delivered(steps) == [Hint(kind="resync", session_lost=True)]


def test_a_new_session_lost_again_before_it_was_handled_still_says_session_lost() -> None:
    """The connection came back on a new session and broke again before the watcher handled
    it: the round delivers nothing (not connected). The reconnection to that session that
    follows must still tell subscribers the session was lost (agents acknowledge again what
    they applied: their acknowledgements went with the old session)."""
    machine = armed(WatchMachine(PATHS))
    assert delivered(run(machine, [Connection(2), Connection(None)], live=False)) == []
    steps = run(machine, [Connection(2)])
    assert delivered(steps) == [Hint(kind="resync", session_lost=True)]
    assert delivered(run(machine, [Connection(None), Connection(2)])) == [Hint(kind="resync")]


def test_a_failed_restore_is_tried_again_every_round_until_it_succeeds() -> None:
    machine = armed(WatchMachine(PATHS))
    run(machine, [Connection(2)], Server(restore=False))
    assert machine.need_restore
    assert Restore() in run(machine, [], Server(restore=False))  # a tick
    assert Restore() in run(machine, [])
    assert not machine.need_restore
    assert Restore() not in run(machine, [])


def test_nothing_is_delivered_while_not_connected() -> None:
    machine = armed(WatchMachine(PATHS))
    steps = run(machine, [Fired(LOC_A), Connection(None)], live=False)
    assert steps == [Ready(armed=False)]
    assert not machine.armed


def test_with_nobody_subscribed_the_watches_are_dropped() -> None:
    machine = armed(WatchMachine(PATHS))
    steps = run(machine, [], subscribed=False)
    assert steps == [Ready(armed=False)] and not machine.armed


# -- missed changes ----------------------------------------------------------------------------


def test_watches_that_could_not_be_set_are_set_later_then_a_resync_covers_the_gap() -> None:
    machine = WatchMachine(PATHS)
    steps = run(machine, [Connection(1)], Server(arm=False))
    assert Ready(armed=True) not in steps and machine.missed
    steps = run(machine, [])  # the next tick
    assert index(steps, ArmAll) < index(steps, lambda s: s == Ready(armed=True))
    assert index(steps, lambda s: s == Ready(armed=True)) < index(steps, Deliver)
    assert delivered(steps) == [Hint(kind="resync")]
    assert delivered(run(machine, [])) == []  # no second resync


def test_a_lost_rearm_disarms_and_the_next_round_arms_and_resyncs() -> None:
    machine = armed(WatchMachine(PATHS))
    steps = run(machine, [Fired(LOC_A)], Server(send=False))
    assert Ready(armed=False) in steps and not machine.armed
    steps = run(machine, [])
    assert ArmAll(acks=False) in steps and Hint(kind="resync") in delivered(steps)


def test_watch_events_before_the_watches_are_armed_are_not_hinted() -> None:
    machine = WatchMachine(PATHS)
    steps = run(machine, [Fired(LOC_A)], live=True)
    assert delivered(steps) == []


# -- changes while armed -----------------------------------------------------------------------


def test_a_changed_location_is_read_with_its_watch_before_the_hint_and_awaited_after() -> None:
    machine = armed(WatchMachine(PATHS))
    steps = run(machine, [Fired(LOC_A)])
    send = index(steps, Send)
    assert steps[send] == Send(reads=(LOC_A,), watches=())
    assert send < index(steps, AwaitReads) < index(steps, Deliver) < index(steps, AwaitRearm)
    assert delivered(steps) == [Hint(kind="location", location="a", record=None)]


def test_a_deleted_location_is_hinted_and_no_longer_watched() -> None:
    machine = armed(WatchMachine(PATHS))
    steps = run(machine, [Fired(LOC_A, deleted=True)])
    assert steps[index(steps, Send)] == Send(reads=(), watches=())
    assert delivered(steps) == [Hint(kind="location", location="a")]
    assert machine.watched == {"b"}


def test_a_new_location_is_watched_and_hinted() -> None:
    machine = armed(WatchMachine(PATHS))
    steps = run(machine, [Fired(PATHS.locations)], Server(names=["a", "b", "c"]))
    assert Rearm(paths=(f"{PATHS.locations}/c",)) in steps
    assert delivered(steps) == [Hint(kind="location", location="c")]
    assert machine.watched == {"a", "b", "c"}


def test_changes_of_one_batch_are_hinted_once_each() -> None:
    machine = armed(WatchMachine(PATHS))
    steps = run(machine, [Fired(LOC_A), Fired(PATHS.workers), Fired(LOC_A)])
    assert sorted((h.kind, h.location) for h in delivered(steps)) == [
        ("location", "a"), ("workers", None)
    ]


def test_an_acks_watch_is_set_again_only_after_the_coalescing_delay() -> None:
    clock = Clock()
    machine = armed(WatchMachine(PATHS, clock=clock, acks_coalesce=0.015), wants_acks=True)
    steps = run(machine, [Fired(ACKS_A)], wants_acks=True)
    assert delivered(steps) == [Hint(kind="acks", location="a")]  # hinted at once
    assert steps[index(steps, Send)] == Send(reads=(), watches=())  # not set again yet
    assert machine.wait() == pytest.approx(0.015)
    clock.now += 0.01
    assert delivered(run(machine, [], wants_acks=True)) == []  # not due yet
    clock.now += 0.01
    steps = run(machine, [], wants_acks=True)  # due: set again, one more hint
    assert steps[index(steps, Send)] == Send(reads=(), watches=(ACKS_A,))
    assert delivered(steps) == [Hint(kind="acks", location="a")]
    assert machine.acks_due == {}


def test_a_subscriber_that_wants_acks_gets_them_watched_and_hinted_for_every_location() -> None:
    machine = armed(WatchMachine(PATHS))
    steps = run(machine, [], wants_acks=True)
    assert steps[index(steps, Send)] == Send(reads=(), watches=(ACKS_A, f"{PATHS.acks_root}/b"))
    assert sorted(h.location or "" for h in delivered(steps)) == ["a", "b"]
    assert steps[-1] == Ready(armed=True) and machine.acks_armed


# -- the orderings, for any sequence of rounds ---------------------------------------------------


event_st = st.one_of(
    st.builds(Connection, st.none() | st.integers(min_value=1, max_value=3)),
    st.builds(Fired, st.sampled_from([LOC_A, ACKS_A, PATHS.workers, PATHS.locations,
                                      f"{PATHS.locations}/c"]), st.booleans()),
)
round_st = st.tuples(
    st.lists(event_st, max_size=4),
    st.booleans(),  # live
    st.booleans(),  # wants acks
    st.builds(Server, restore=st.booleans(), arm=st.booleans(), send=st.booleans(),
              reads_fail=st.booleans(), rearm=st.booleans()),
)


@given(st.lists(round_st, min_size=1, max_size=12))
def test_every_round_keeps_the_orderings(rounds: list[Any]) -> None:
    """Whatever happens: nothing is delivered while not connected; a round restores before it
    arms; re-arming requests are sent before the hints and awaited after; once a failure may
    have let a change slip by, the round that next arms every watch hints ``resync``; a new
    session's ``session_lost`` is said by the first resync delivered after it."""
    clock = Clock()
    machine = WatchMachine(PATHS, clock=clock)
    gap = False  # a change may have been missed since the last delivered resync
    last_session: int | None = None
    lost_unsaid = False
    for events, live, wants_acks, server in rounds:
        clock.now += 0.01
        for event in events:
            if isinstance(event, Connection) and event.session is not None:
                if last_session is not None and event.session != last_session:
                    lost_unsaid = True
                last_session = event.session
        steps = run(machine, events, server, live=live, wants_acks=wants_acks)
        if not live:
            assert not any(isinstance(s, Deliver) for s in steps)
        if Restore() in steps and any(isinstance(s, ArmAll) for s in steps):
            assert index(steps, Restore) < index(steps, ArmAll)
        if any(isinstance(s, Send) for s in steps):
            send = index(steps, Send)
            later = [i for i, s in enumerate(steps) if isinstance(s, Deliver) and i > send]
            if later and any(isinstance(s, AwaitRearm) for s in steps):
                assert later[0] < index(steps, AwaitRearm)
        armed_now = any(isinstance(s, ArmAll) for s in steps) and machine.armed
        resyncs = [h for h in delivered(steps) if h.kind == "resync"]
        if gap and armed_now:
            assert resyncs, steps
        if resyncs:
            gap = False
            if lost_unsaid:
                assert resyncs[-1].session_lost, steps
                lost_unsaid = False
        if any(
            (isinstance(s, ArmAll) and server.arm is False)
            or (isinstance(s, Send) and not server.send)
            or (isinstance(s, AwaitReads) and server.reads_fail)
            or (isinstance(s, (Rearm, AwaitRearm)) and not server.rearm)
            or (isinstance(s, ListLocations) and not server.arm)
            for s in steps
        ):
            gap = True
