"""The copy of the worker list and the marker that keeps it as fresh as the records.

Why it is shaped so: the manager looks at the live workers on every transition (its settle
needs them), and serving :meth:`ZooKeeperBackend.workers` from a copy keeps a transition at two
round trips (read, multi-op), the same as the raw kazoo baseline in ``bench/raw_zk.py``. The
copy is dropped by watches on ``workers`` (children and each node's data), by any connection
change and by this backend's own registration writes. But a watch runs on kazoo's callback
thread, after the answer that followed its event may already have reached the caller: a record
read after a worker registered could meet a copy from before (docs/zookeeper.md, "Workers and
acknowledgements"), and a settle must see every worker registered before the write it settles.
So the copy is served only once a marker queued behind every callback received so far has run
on that thread (:meth:`WorkersCopy.fresh`); otherwise the list is read from the server.

ZooKeeper delivers a watch event before any answer that follows it on the session, and kazoo
queues the event's callbacks before it hands that answer over, so once the marker ran, every
registration change visible to an earlier answer has dropped the copy.

Usage::

    copy = WorkersCopy(dispatch=run_on_callback_thread, live=connected.is_set)
    listed = copy.fresh()                   # the copy, or None: read the server
    if listed is None:
        epoch = copy.epoch
        listed = read_from_server()
        copy.keep(epoch, listed)            # kept unless dropped meanwhile
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from locstatus.models import WorkerInfo

EVENTS_WAIT = 0.5
"""Seconds :meth:`WorkersCopy.fresh` waits for kazoo's callback thread to handle the watch
events received so far before it reads the list from the server instead (a thread that busy is
stuck; the read is as fresh, one round trip dearer)."""


class WorkersCopy:
    """The worker list as last read with watches armed, and when it may be served.

    ``dispatch(fn)`` runs ``fn`` on kazoo's callback thread, after every callback queued
    before it; ``live()`` tells whether the session is connected (no copy is served or kept
    while it is not). Thread-safe; :meth:`forget` never blocks on I/O (it runs on kazoo's
    threads).
    """

    def __init__(
        self, dispatch: Callable[[Callable[[], None]], None], live: Callable[[], bool]
    ) -> None:
        self._dispatch = dispatch
        self._live = live
        self._lock = threading.Lock()
        self._copy: list[WorkerInfo] | None = None
        self._epoch = 0
        self._callback_ident: int | None = None  # kazoo's callback thread, once seen

    @property
    def epoch(self) -> int:
        """Changes with every :meth:`forget`: a list read before it is not kept."""
        with self._lock:
            return self._epoch

    def forget(self) -> None:
        """Drop the copy (any thread)."""
        with self._lock:
            self._copy = None
            self._epoch += 1

    def keep(self, epoch: int, listed: list[WorkerInfo]) -> None:
        """Keep ``listed`` as the copy, unless it was dropped since ``epoch`` was taken (a
        change may have been missed) or the session is not live."""
        with self._lock:
            if self._epoch == epoch and self._live():
                self._copy = list(listed)

    def fresh(self) -> list[WorkerInfo] | None:
        """The copy, when there is one, the session is live and every watch callback received
        before this call has run; None: read the server."""
        with self._lock:
            if self._copy is None or not self._live():
                return None
        if not self._events_handled():
            return None
        with self._lock:
            if self._copy is not None and self._live():
                return list(self._copy)
        return None

    def _events_handled(self) -> bool:
        """Wait until kazoo's callback thread has run every callback queued before this call
        (a marker queued behind them has run), at most :data:`EVENTS_WAIT` seconds. False on
        that thread itself (it would wait for itself), or when it is stuck."""
        if threading.get_ident() == self._callback_ident:
            return False
        done = threading.Event()

        def marker() -> None:
            self._callback_ident = threading.get_ident()
            done.set()

        self._dispatch(marker)
        return done.wait(EVENTS_WAIT)
