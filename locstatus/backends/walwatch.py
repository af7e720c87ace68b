"""Wakes the SQLite hint poller when any process of the host writes the database (Linux inotify).

Why it is shaped so: the SQLite backend learns of changes by reading its ``changes`` log
(docs/agent.md, "Level-triggered"); read every ``poll_interval`` seconds (0.05) alone, a hint
waited 25 ms on average and up to 50 ms, the largest stage of a bridged pause
(bench/bridge.py ``--trace``). Polling faster would cost CPU at idle. Every committed write
of a WAL-mode database, from any process, appends to its ``-wal`` file, and the kernel
reports each such write to an inotify watch at no cost while nothing is written. So the
poller sleeps in the watch, up to its interval (the interval stays the safety net: another
host's writes on a shared file system, a platform without inotify), and reads the log as soon
as the file was written. The ``-shm`` index and the ``-clock`` stamp file are not reported.

A write is reported when SQLite writes its frames, a moment before the commit is visible to
readers (SQLite publishes it in the ``-shm`` index afterwards, through a memory map, which
inotify does not see): :meth:`WalWatch.wait` returns after a short coalescing delay, and a
poller that then finds nothing looks again shortly (:data:`RETRY_DELAYS`). While the watch
works the poll runs every :data:`WATCHED_POLL` seconds: fewer reads at idle than before.

:func:`open_wal_watch` returns None where inotify is unavailable (not Linux, the
``inotify_simple`` package missing, the kernel's watch limit reached): the caller polls.

Usage::

    watch = open_wal_watch("/var/lib/locstatus/locstatus.db")
    written = watch.wait(0.05) if watch is not None else stop.wait(0.05)
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from typing import Any

__all__ = ["COALESCE", "RETRY_DELAYS", "WATCHED_POLL", "WalWatch", "open_wal_watch"]

log = logging.getLogger(__name__)

COALESCE = 0.001
"""Seconds waited after the first write reported, so that the frames of one transaction (and
of its neighbours) are read as one wake-up."""


WATCHED_POLL = 1.0
"""Seconds between reads of the log while the watch works (at least the backend's
``poll_interval``): then the poll only catches what the watch could not report."""

RETRY_DELAYS = tuple(0.001 * 2**i for i in range(10))
"""Seconds waited before each further look at the log after a reported write showed nothing
new yet (1, 2, 4 ... 512 ms: about a second in all): the commit becomes visible once SQLite
has synced the file and updated its index, after the write was reported; and some writes
log no change at all (a lease renewal)."""


class WalWatch:
    """An inotify watch on the directory of one database, reporting writes of its ``-wal``
    file (the directory is watched, not the file: the file is deleted when the last
    connection closes and created again by the next writer). One poller thread waits in it;
    :meth:`interrupt` (any thread) ends its wait at once, for the backend's ``close``."""

    def __init__(self, inotify: Any, flags: Any, db_path: str) -> None:
        self._inotify = inotify
        self._flags = flags
        self._name = os.path.basename(db_path) + "-wal"
        self._wake_r, self._wake_w = os.pipe()
        self._poll = select.poll()
        self._poll.register(inotify.fileno(), select.POLLIN)
        self._poll.register(self._wake_r, select.POLLIN)
        self._lock = threading.Lock()
        self._closed = False
        self.alive = True

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a write of the WAL file; True when one was
        reported (after :data:`COALESCE` more seconds, to read its neighbours with it).
        Writes of other files of the directory are waited through, not reported. False at
        once after :meth:`interrupt`. A watch whose directory went away reports no more
        (``alive`` False): the caller then polls."""
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            try:
                ready = {fd for fd, _ in self._poll.poll(round(left * 1000))}
                if self._wake_r in ready:
                    return False
                if not ready:
                    return False  # timed out
                time.sleep(COALESCE)
                events = self._inotify.read(timeout=0)
            except OSError as exc:  # the kernel refused, or the watch was closed
                log.warning("watching the SQLite WAL file stopped: %s", exc)
                self.alive = False
                return False
            written = False
            for event in events:
                if event.mask & self._flags.Q_OVERFLOW:  # events were lost: look
                    written = True
                elif event.mask & self._flags.IGNORED:  # the directory was removed
                    self.alive = False
                elif event.name == self._name:
                    written = True
            if written or not self.alive or left <= 0:
                return written

    def interrupt(self) -> None:
        """End the current (and every later) :meth:`wait` at once."""
        with self._lock:
            if not self._closed:
                os.write(self._wake_w, b"x")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._inotify.close()
            os.close(self._wake_r)
            os.close(self._wake_w)


def open_wal_watch(db_path: str) -> WalWatch | None:
    """A :class:`WalWatch` on ``db_path``'s WAL file, or None where inotify is unavailable
    (then the caller polls only; logged at debug level)."""
    try:
        from inotify_simple import INotify, flags  # type: ignore[import-untyped]
    except (ImportError, AttributeError, OSError) as exc:  # not Linux, or not installed
        log.debug("no inotify (%s): SQLite hints are polled only", exc)
        return None
    directory = os.path.dirname(os.path.abspath(db_path))
    try:
        inotify = INotify()
    except OSError as exc:  # the per-user instance limit
        log.debug("no inotify instance (%s): SQLite hints are polled only", exc)
        return None
    try:
        inotify.add_watch(directory, flags.MODIFY)
    except OSError as exc:  # the per-user watch limit, or a file system without inotify
        inotify.close()
        log.debug("cannot watch %s (%s): SQLite hints are polled only", directory, exc)
        return None
    return WalWatch(inotify, flags, db_path)
