"""The watcher thread of the ZooKeeper backend: kazoo's events in, hints out, each step of the
:class:`~locstatus.backends.zookeeper.session.WatchMachine` carried out as I/O.

Why it is shaped so: kazoo calls back on its own threads (the connection thread for state
changes, the callback thread for watches), where nothing may block. So its callbacks only
note what they must at once (connected or not, the worker list's copy dropped) and enqueue;
this backend's own thread takes the events in batches, lets the machine decide, and performs
the steps in the order the machine yields them. The decisions and their order are in
``session.py``; what each step sends and how its failure reads is here.

Hints come from watches (children of ``locations`` and ``workers``, data of each
``locations/<loc>`` and ``acks/<loc>``), coalesced per batch, delivered through
:class:`~locstatus.backends.hints.Subscribers` (a subscriber that raises is logged, never the
thread's end).

A changed location's read (the one that sets its watch again and that its hint carries) is sent
from kazoo's callback thread as the watch fires (:meth:`Watcher.on_watch`, a request queued, no
wait), not once this thread has woken for the event: the round trip runs while the event crosses
to this thread, which takes the answer when the machine asks for the read (:class:`Send`). On a
bridge's pause (bench/bridge.py, docs/benchmarks.md "The Backbeat bridge") that crossing was the
largest step between the watch firing and the hint, up to 13 ms at p99 on 2 shared cores.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Collection
from typing import Any

from kazoo.client import KazooState
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, WatchedEvent, ZnodeStat

from locstatus.backends.base import HintCallback, Unsubscribe
from locstatus.backends.hints import Subscribers, wants
from locstatus.backends.zookeeper.client import ZkClient
from locstatus.backends.zookeeper.freshness import WorkersCopy
from locstatus.backends.zookeeper.layout import Layout
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
from locstatus.errors import LocstatusError
from locstatus.models import LocationStatus

log = logging.getLogger(__name__)

_WATCH_ERRORS = (KazooException, KazooTimeoutError)


class Watcher:
    """The session and watch handling of one backend, on a thread of its own.

    ``decode(location, raw, stat)`` turns a location node read while re-arming into a record;
    ``restore()`` puts this backend's registrations back on a new session (True when done).
    """

    def __init__(
        self,
        client: ZkClient,
        paths: Layout,
        copy: WorkersCopy,
        *,
        decode: Callable[[str, bytes, ZnodeStat], LocationStatus],
        restore: Callable[[], bool],
    ) -> None:
        self.client = client
        self.paths = paths
        self.copy = copy
        self.kazoo = client.kazoo
        self._decode = decode
        self._restore = restore
        self.machine = WatchMachine(paths)
        self.subscribers = Subscribers(client.where)
        self.ready = threading.Event()
        """Set while the watches a subscriber asked for are armed (``subscribe`` waits)."""
        self._events: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._reads: list[tuple[str, Any]] = []
        self._rearming: list[Any] = []
        self._location_prefix = paths.locations + "/"
        self._prefetched: dict[str, Any] = {}
        """Location path -> the read :meth:`on_watch` sent when its watch last fired (kazoo's
        async result), taken by :meth:`_send_reads`; written before the event is queued."""
        self._prefetch_lock = threading.Lock()
        self.thread = threading.Thread(
            target=self._run, name=f"locstatus-zk{paths.root.replace('/', '-')}", daemon=True
        )

    # -- kazoo's threads: note, enqueue, return ----------------------------------------------

    def on_state(self, state: str) -> None:
        """kazoo's connection thread: note the state, hand the rest to our thread, return."""
        if state == KazooState.CONNECTED:
            self.client.connected()
        else:
            self.client.disconnected()
        self.copy.forget()
        self._events.put(("state", state))

    def on_watch(self, event: WatchedEvent) -> None:
        """kazoo's callback thread: for a location's node that changed (or was created), send
        its read with the watch set again (queued, not waited for: see the module docstring);
        then enqueue and return."""
        path = event.path or ""
        if event.type == EventType.NONE or path.startswith(self.paths.workers):
            self.copy.forget()
        elif (event.type in (EventType.CHANGED, EventType.CREATED) and self.machine.armed
              and self._is_location(path)):
            # armed only: the read sets the watch again, and a disarmed backend's watches
            # must die out (nobody subscribed, or every one is armed anew after a reconnection)
            self._prefetch(path)
        self._events.put(("watch", event))

    def _is_location(self, path: str) -> bool:
        prefix = self._location_prefix
        return path.startswith(prefix) and "/" not in path[len(prefix):]

    def _prefetch(self, path: str) -> None:
        """Send the read of ``path`` with a watch, sent after the change its watch fired for,
        so its answer holds that change or a later one; it replaces an earlier one not taken
        yet (that one's answer may be older). Failing to send leaves nothing: the round sends
        its own read, and fails as it would have."""
        try:
            item: Any = self.kazoo.get_async(path, watch=self.on_watch)
        except _WATCH_ERRORS:
            item = None
        with self._prefetch_lock:
            if item is None:
                self._prefetched.pop(path, None)
            else:
                self._prefetched[path] = item

    # -- subscribers -------------------------------------------------------------------------

    def subscribe(self, callback: HintCallback, kinds: Collection[str] | None) -> Unsubscribe:
        """Add a subscriber; returns once the watches it needs are armed (at most ``timeout``
        seconds), so any change after that is hinted."""
        unsubscribe = self.subscribers.add(callback, kinds)
        wanted = None if kinds is None else frozenset(kinds)
        if wants(wanted, "acks") and not self.machine.acks_armed:
            self.ready.clear()  # set again once the acks watches are armed too
        self._events.put(("subscribe", None))
        if threading.current_thread() is not self.thread:
            self.ready.wait(self.client.params.timeout)
        return unsubscribe

    # -- our thread --------------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """End the thread (at most 5 s) and deliver nothing more."""
        self._events.put(("stop", None))
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=5)
        self.subscribers.close()

    def _run(self) -> None:
        while True:
            try:
                batch = [self._events.get(timeout=self.machine.wait())]
            except queue.Empty:
                batch = [("tick", None)]
            while True:
                try:
                    batch.append(self._events.get_nowait())
                except queue.Empty:
                    break
            if any(kind == "stop" for kind, _ in batch):
                return
            try:
                self._handle(batch)
            except Exception:  # keep the thread alive whatever a request did
                log.exception("zookeeper backend %s: event handling failed", self.paths.root)

    def _handle(self, batch: list[tuple[str, object]]) -> None:
        """Run one round of the machine over ``batch``, performing each step it yields."""
        subscribers = self.subscribers
        rnd = self.machine.round(
            self._events_of(batch),
            live=self.client.live.is_set,
            subscribed=lambda: bool(subscribers),
            wants_acks=lambda: subscribers.wanted("acks"),
        )
        outcome: object = None
        while True:
            try:
                step = rnd.send(outcome)
            except StopIteration:
                return
            outcome = self._perform(step)

    def _events_of(self, batch: list[tuple[str, object]]) -> list[Event]:
        """The machine's events: a state change with the session connected now (read as it is
        handled: it may be gone again already), watch events but kazoo's connection notices
        (type NONE: every watch is set again after a reconnection anyway)."""
        out: list[Event] = []
        for kind, arg in batch:
            if kind == "state":
                session = self.client.session_id if arg == KazooState.CONNECTED else None
                out.append(Connection(session))
            elif kind == "watch":
                event: WatchedEvent = arg
                if event.type != EventType.NONE:
                    out.append(Fired(event.path, deleted=event.type == EventType.DELETED))
        return out

    def _perform(self, step: Step) -> object:
        """Carry out one step; its outcome (see each step's class)."""
        match step:
            case Ready(armed=True):
                self.ready.set()
            case Ready(armed=False):
                self.ready.clear()
                with self._prefetch_lock:  # kazoo dropped their watches: arming reads anew
                    self._prefetched.clear()
            case Deliver(hints):
                self.subscribers.deliver(hints)
            case Restore():
                return self._restore()
            case ArmAll(acks):
                return self._arm_all(acks)
            case ListLocations():
                return self._list_locations()
            case Rearm(paths):
                return self._send_rearm(paths) and self._await_rearm()
            case Send(reads, watches):
                return self._send_reads(reads), self._send_rearm(watches)
            case AwaitReads():
                return self._await_reads()
            case AwaitRearm():
                return self._await_rearm()
        return None

    # -- the I/O of each step ----------------------------------------------------------------

    def _arm_all(self, acks: bool) -> list[str] | None:
        """Watch everything again (after subscribe or a reconnection)."""
        pa, kazoo, watch = self.paths, self.kazoo, self.on_watch
        try:
            names: list[str] = self.client.get(kazoo.get_children_async(pa.locations, watch=watch))
            pending = [kazoo.get_children_async(pa.workers, watch=watch)]
            for name in names:
                pending.append(kazoo.exists_async(f"{pa.locations}/{name}", watch=watch))
                if acks:
                    pending.append(kazoo.exists_async(f"{pa.acks_root}/{name}", watch=watch))
            for item in pending:
                self.client.get(item)
        except _WATCH_ERRORS as exc:
            log.info("zookeeper backend %s: watches not armed yet: %s", pa.root, exc)
            return None
        return names

    def _list_locations(self) -> list[str] | None:
        try:
            names: list[str] = self.client.get(
                self.kazoo.get_children_async(self.paths.locations, watch=self.on_watch)
            )
        except _WATCH_ERRORS:
            return None
        return names

    def _send_reads(self, paths: tuple[str, ...]) -> bool:
        """Read changed locations with a watch set again (False if sending failed): the read
        :meth:`on_watch` sent when the watch fired where there is one (the machine asks for a
        location's read only for a watch that fired, after :meth:`on_watch` ran for it), else a
        new one."""
        with self._prefetch_lock:
            ready = {p: self._prefetched.pop(p) for p in paths if p in self._prefetched}
        try:
            self._reads = [
                (p.rpartition("/")[2],
                 ready[p] if p in ready else self.kazoo.get_async(p, watch=self.on_watch))
                for p in paths
            ]
        except _WATCH_ERRORS:
            self._reads = []
            return False
        return True

    def _await_reads(self) -> tuple[list[tuple[str, LocationStatus | None]], bool]:
        """The records read by :meth:`_send_reads`: None in place of one that is gone, corrupt
        or unreadable (its hint then carries no record; a subscriber reads and sees why), and
        whether an answer failed to come."""
        pending, self._reads = self._reads, []
        out: list[tuple[str, LocationStatus | None]] = []
        failed = False
        for name, item in pending:
            try:
                raw, stat = self.client.get(item)
            except NoNodeError:
                out.append((name, None))  # deleted meanwhile: its DELETED event follows
                continue
            except _WATCH_ERRORS:
                failed = True
                out.append((name, None))
                continue
            try:
                out.append((name, self._decode(name, raw, stat)))
            except LocstatusError:
                out.append((name, None))
        return out, failed

    def _send_rearm(self, paths: tuple[str, ...]) -> bool:
        """Send the requests that set the watches on ``paths`` again; False if sending failed."""
        kazoo, watch = self.kazoo, self.on_watch
        try:
            self._rearming = [
                kazoo.get_children_async(p, watch=watch)
                if p == self.paths.workers
                else kazoo.exists_async(p, watch=watch)
                for p in paths
            ]
        except _WATCH_ERRORS:
            self._rearming = []
            return False
        return True

    def _await_rearm(self) -> bool:
        pending, self._rearming = self._rearming, []
        try:
            for item in pending:
                self.client.get(item)
        except _WATCH_ERRORS:
            return False
        return True
