"""A controllable aware-UTC clock for tests (``Manager(clock=...)``, the app, the reconciler).

Scheduled resumes, leases and tombstone TTLs are data compared with "now", so tests move time
forward instead of sleeping.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

DEFAULT_START = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


class FakeClock:
    """Call it for the current (fake) time; ``advance(seconds)`` or ``advance(hours=2)``."""

    def __init__(self, start: datetime = DEFAULT_START) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    @property
    def now(self) -> datetime:
        return self()

    def advance(self, seconds: float = 0.0, **kw: float) -> datetime:
        with self._lock:
            self._now += timedelta(seconds=seconds, **kw)
            return self._now
