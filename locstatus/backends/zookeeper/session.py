"""The watcher's state machine: what the ZooKeeper backend does about connection changes, watch
events and subscribers, decided purely, as a sequence of steps the watcher thread carries out.

Why it is shaped so: kazoo drops every watch when a connection breaks, a new session loses the
ephemeral registrations, and a subscriber must never miss a change nor wait a round trip for
its hint. What to do about each of these depends on what happened before (is this session new?
were watches armed? did arming fail?), and the order of the I/O is itself part of the
correctness argument. Both used to live in one method steering on ten instance flags, with the
ordering argument in a comment. Here the flags are the fields of one :class:`WatchMachine`,
and the ordering is the order in which :meth:`WatchMachine.round` yields its :data:`Step`
values; the watcher (:mod:`~locstatus.backends.zookeeper.watcher`) performs each step and sends
its outcome back. Tests drive a round with fake events and outcomes and read the steps.

The orderings this keeps, each exercised by ``tests/test_zk_session.py``:

- a **state change** disarms every watch (kazoo dropped them); a reconnection hints ``resync``
  (``session_lost`` when the session id changed);
- on a **new session** this backend's registrations are put back (:class:`Restore`) before the
  watches are armed again, and again on every round until that succeeds;
- nothing is delivered while **not connected** (a ``resync`` follows the reconnection); a new
  session whose round found the connection broken again is still reported: the ``resync``
  of the reconnection that follows says ``session_lost`` (``lost_unsaid``);
- after watches could not be set (**missed**), the round that arms them again hints ``resync``
  after arming, so whatever changed while they were not set is re-read;
- a **changed location's watch** is set again by reading it (its hint carries that record),
  other watches by an ``exists``/``get_children``: the re-arming requests are sent
  (:class:`Send`) *before* the hints are delivered and awaited (:class:`AwaitRearm`) *after*.
  A session answers in order, so any read a subscriber makes after its hint reaches the server
  after the watch is set again (no change can slip between them), and the hint does not wait a
  round trip;
- an ``acks/<loc>`` watch (touched by every acknowledgement) is set again only
  :data:`ACKS_COALESCE` seconds after it fired, followed by one more hint that covers whatever
  changed meanwhile, so a fleet acknowledging at once wakes each subscriber twice, not once per
  worker; acknowledgement nodes are watched only while a subscriber wants ``acks`` hints;
- ``subscribe()`` waits for :class:`Ready` (``armed=True``) after the arming it asked for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

from locstatus.backends.hints import HintBatch
from locstatus.backends.zookeeper.layout import Layout
from locstatus.models import Hint, LocationStatus

ACKS_COALESCE = 0.015
"""Seconds an ``acks/<loc>`` watch stays unarmed after it fired. Every acknowledgement touches
that node, so a fleet acknowledging a change would otherwise wake every subscribed process once
per worker; instead the first one is hinted at once and the watch is set again this much later,
followed by one more hint that covers whatever changed meanwhile."""
IDLE_WAKE = 1.0
"""Seconds the watcher sleeps with nothing due (a tick then runs a round: a failed arming or
restore is tried again)."""


# -- what happens (events) ---------------------------------------------------------------------


@dataclass(frozen=True)
class Connection:
    """The connection changed: ``session`` is the id of the session now connected, None when
    not connected (suspended, lost, or connected and lost again before this was handled)."""

    session: int | None


@dataclass(frozen=True)
class Fired:
    """A watch fired on ``path`` (``deleted``: the node went)."""

    path: str
    deleted: bool = False


Event = Connection | Fired
"""What the watcher hands to a round. A tick or a new subscriber is a round without events."""


# -- what to do (steps) ------------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """Tell ``subscribe()`` whether the watches it waits for are set (``armed``). No outcome."""

    armed: bool


@dataclass(frozen=True)
class Restore:
    """Put back this backend's worker registrations on the new session. Outcome: True when
    they are back."""


@dataclass(frozen=True)
class ArmAll:
    """Set every watch: the children of ``locations`` and ``workers``, each location's node,
    and with ``acks`` each ``acks/<loc>``. Outcome: the location names listed, None when it
    failed."""

    acks: bool


@dataclass(frozen=True)
class ListLocations:
    """List the children of ``locations`` with a watch. Outcome: the names, None on failure."""


@dataclass(frozen=True)
class Rearm:
    """Set the watches on ``paths`` again (``exists`` with a watch), waiting for the answers.
    Outcome: True when every one is set."""

    paths: tuple[str, ...]


@dataclass(frozen=True)
class Send:
    """Send, without waiting: a read with a watch of each of ``reads`` (changed locations),
    and the re-arming request of each of ``watches``. Outcome: ``(reads sent, watches sent)``."""

    reads: tuple[str, ...]
    watches: tuple[str, ...]


@dataclass(frozen=True)
class AwaitReads:
    """Wait for the reads sent. Outcome: ``([(location, record or None)], failed)``: None in
    place of a record gone, corrupt or unreadable; ``failed`` when an answer did not come."""


@dataclass(frozen=True)
class Deliver:
    """Deliver ``hints`` to the subscribers. No outcome."""

    hints: tuple[Hint, ...]


@dataclass(frozen=True)
class AwaitRearm:
    """Wait for the re-arming requests sent. Outcome: True when every watch is set."""


Step = Ready | Restore | ArmAll | ListLocations | Rearm | Send | AwaitReads | Deliver | AwaitRearm
Round = Generator[Step, Any, None]
"""A round: it yields steps and is sent each step's outcome (None for those without)."""


class WatchMachine:
    """The state of the watches and the session, and the rounds that change it.

    Fields (read by the watcher, written only here): ``session`` (the id last connected),
    ``need_restore`` (a new session's registrations are not back yet), ``armed`` (the watches
    are set), ``missed`` (changes may have been missed: ``resync`` once armed), ``acks_armed``
    (acknowledgement nodes are watched), ``lost_unsaid`` (a new session no delivered
    ``resync`` has reported yet), ``watched`` (the location names watched), ``acks_due``
    (``acks/<loc>`` path -> the ``clock()`` time its watch is set again).

    Usage (what the watcher does)::

        machine = WatchMachine(Layout("/locstatus"))
        rnd = machine.round([Connection(session=0x1234)], live=..., subscribed=...,
                            wants_acks=...)
        outcome = None
        try:
            while True:
                outcome = perform(rnd.send(outcome))
        except StopIteration:
            pass
    """

    def __init__(
        self,
        paths: Layout,
        *,
        clock: Callable[[], float] = time.monotonic,
        acks_coalesce: float = ACKS_COALESCE,
    ) -> None:
        self.paths = paths
        self.clock = clock
        self.acks_coalesce = acks_coalesce
        self._location_prefix = paths.locations + "/"
        self.session: int | None = None
        self.need_restore = False
        self.armed = False
        self.missed = False
        self.acks_armed = False
        self.lost_unsaid = False
        self.watched: set[str] = set()
        self.acks_due: dict[str, float] = {}

    def wait(self) -> float:
        """Seconds until the next round is due with no event: the nearest ``acks`` re-arm, at
        most :data:`IDLE_WAKE`."""
        if not self.acks_due:
            return IDLE_WAKE
        return min(IDLE_WAKE, max(0.0, min(self.acks_due.values()) - self.clock()))

    def round(
        self,
        events: Iterable[Event],
        *,
        live: Callable[[], bool],
        subscribed: Callable[[], bool],
        wants_acks: Callable[[], bool],
    ) -> Round:
        """One batch of ``events`` and what follows from it (see the module docstring).
        ``live()``: connected now; ``subscribed()``: someone subscribed; ``wants_acks()``: some
        subscriber wants ``acks`` hints (each asked at the point the decision is made)."""
        hints = HintBatch()
        children_changed = False
        rearm: set[str] = set()
        for event in events:
            if isinstance(event, Connection):
                if event.session is not None:  # None: disconnected again already: wait
                    if self.session is not None:
                        if event.session != self.session:
                            self.need_restore = True
                            self.lost_unsaid = True
                        hints.resync(session_lost=self.lost_unsaid)
                    self.session = event.session
                yield from self._disarm()  # kazoo drops every watch when a connection breaks
                continue
            if not self.armed:
                continue
            hint, again = self._classify(event)
            if hint is not None:
                hints.add(hint)
            if event.path == self.paths.locations:
                children_changed = True
            elif again and hint is not None and hint.kind == "acks":
                self.acks_due.setdefault(event.path, self.clock() + self.acks_coalesce)
            elif again:
                rearm.add(event.path)
        if not live():
            return  # nothing is delivered: a resync follows the reconnection
        if self.need_restore and (yield Restore()):
            self.need_restore = False
        if not subscribed():
            yield from self._disarm()
            return
        if not self.armed:
            yield from self._arm_all(hints, wants_acks())
        else:
            yield from self._armed_round(hints, rearm, children_changed, wants_acks())
        yield from self._deliver(hints)

    # -- the parts of a round ----------------------------------------------------------------

    def _arm_all(self, hints: HintBatch, acks: bool) -> Round:
        names = yield ArmAll(acks=acks)
        if names is None:
            self.missed = True  # a resync follows once they are armed
            return
        self.watched = set(names)
        self.acks_armed = acks
        self.armed = True
        yield Ready(armed=True)
        if self.missed:
            self.missed = False
            hints.resync()

    def _armed_round(
        self, hints: HintBatch, rearm: set[str], children_changed: bool, wants_acks: bool
    ) -> Round:
        pa = self.paths
        if not self.acks_armed and wants_acks:
            # A subscriber that wants acks joined: watch every acknowledgement node now, and
            # hint every location's acks (they may have changed before the watches).
            self.acks_armed = True
            rearm |= {f"{pa.acks_root}/{n}" for n in self.watched}
            for n in self.watched:
                hints.add(Hint(kind="acks", location=n))
        if children_changed:
            yield from self._refresh_locations(hints)
        now = self.clock()
        for path, due in list(self.acks_due.items()):
            if due <= now:  # set the watch again and hint what changed while it was not
                del self.acks_due[path]
                rearm.add(path)
                name = path.rpartition("/")[2]
                hints.add(Hint(kind="acks", location=name))
        reads = tuple(sorted(p for p in rearm if p.startswith(self._location_prefix)))
        watches = tuple(sorted(p for p in rearm if not p.startswith(self._location_prefix)))
        reads_sent, watches_sent = yield Send(reads=reads, watches=watches)
        if not reads_sent or not watches_sent:
            yield from self._lost()
        records: list[tuple[str, LocationStatus | None]]
        records, failed = yield AwaitReads()
        if failed:
            yield from self._lost()
        for name, rec in records:
            hints.add(Hint(kind="location", location=name, record=rec))
        yield from self._deliver(hints)
        if not (yield AwaitRearm()):
            yield from self._lost()
        if self.armed:
            yield Ready(armed=True)  # a subscriber waits for the acks watches it asked for

    def _refresh_locations(self, hints: HintBatch) -> Round:
        """The children of ``locations`` changed: watch the new ones, hint added and removed."""
        pa = self.paths
        listed = yield ListLocations()
        if listed is None:
            yield from self._lost()
            return
        names = set(listed)
        added, removed = names - self.watched, self.watched - names
        acks = {f"{pa.acks_root}/{n}" for n in added} if self.acks_armed else set()
        paths = {f"{pa.locations}/{n}" for n in added} | acks
        if not (yield Rearm(paths=tuple(sorted(paths)))):
            yield from self._lost()
        self.watched = names
        for n in sorted(added | removed):
            hints.add(Hint(kind="location", location=n))

    def _classify(self, event: Fired) -> tuple[Hint | None, bool]:
        """The hint a watch event stands for, and whether to arm the watch again."""
        pa = self.paths
        path = event.path
        parent, _, name = path.rpartition("/")
        if path == pa.locations:
            return None, False
        if path == pa.workers:
            return Hint(kind="workers"), True
        if parent == pa.locations:
            if event.deleted:
                self.watched.discard(name)
                return Hint(kind="location", location=name), False
            return Hint(kind="location", location=name), True
        if parent == pa.acks_root:
            return Hint(kind="acks", location=name), self.acks_armed and name in self.watched
        return None, False

    def _deliver(self, hints: HintBatch) -> Round:
        """Deliver what ``hints`` holds (nothing when empty). Whatever its cause, a ``resync``
        delivered while a new session is unreported says ``session_lost``, and reports it."""
        if not hints:
            return
        batch = hints.take()
        if any(h.kind == "resync" for h in batch):
            if self.lost_unsaid:
                batch = [Hint(kind="resync", session_lost=True) if h.kind == "resync" else h
                         for h in batch]
            self.lost_unsaid = False
        yield Deliver(tuple(batch))

    def _disarm(self) -> Round:
        self.armed = False
        self.acks_due.clear()  # every watch is set again by ArmAll, then a resync
        yield Ready(armed=False)

    def _lost(self) -> Round:
        """Setting watches failed: disarmed, armed again on the next round or reconnection,
        then a ``resync`` hint covers whatever changed meanwhile."""
        yield from self._disarm()
        self.missed = True
