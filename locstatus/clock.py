"""Time as the store tells it: the one clock every deadline is judged on.

Leases, scheduled resumes and tombstone ages are deadlines shared by processes on many hosts.
A host's own wall clock may be off by seconds or hours, so no process judges a shared deadline
on it alone (docs/time.md). A :class:`TimeSource` answers "what time is it at the backend",
with a bound on how wrong that answer may be; the manager owns one and every front end asks it.

This module holds the contract and the trivial source used where the time *is* the caller's
(tests with a fake clock, the in-memory backend). The measuring source lives beside it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime, timedelta

Clock = Callable[[], datetime]
"""A callable returning the current time as an aware UTC datetime."""


class TimeSource(ABC):
    """The backend's time, as well as this process can tell it.

    ``now()`` is an aware UTC datetime on the backend's clock. ``uncertainty_seconds()`` bounds
    how far it may be from the backend's real time. Acting decisions ("this lease lapsed", "this
    resume is due", "this tombstone is old enough") use :meth:`is_past`, which is true only when
    the deadline has passed even at the worst end of that bound.
    """

    @abstractmethod
    def now(self) -> datetime:
        """The backend's current time (aware UTC), estimated by this process."""

    @abstractmethod
    def offset_seconds(self) -> float | None:
        """This process's wall clock minus the backend's time, in seconds (positive: this
        host is ahead); None while it has not been measured."""

    @abstractmethod
    def uncertainty_seconds(self) -> float:
        """How far :meth:`now` may be from the backend's real time, in seconds (>= 0)."""

    def is_past(self, deadline: datetime) -> bool:
        """True when ``deadline`` (aware UTC) has passed by the backend's time, beyond doubt."""
        return self.now() - timedelta(seconds=self.uncertainty_seconds()) >= deadline

    @property
    def max_uncertainty_seconds(self) -> float:
        """The bound this source holds deadlines to (seconds): above it, :meth:`is_past`
        refuses (answers False) rather than guess. 0 for an exact source."""
        return 0.0

    @property
    def refusals(self) -> int:
        """How many deadline decisions this source refused because it could not meet its
        bound (docs/time.md "When the bound cannot be met"). Always 0 for an exact source."""
        return 0

    def problem(self) -> str | None:
        """Why deadlines are refused right now (backend time unknown, uncertainty above the
        bound), or None when they are judged normally."""
        return None


class CallerClock(TimeSource):
    """A source whose time is the caller's own: a fake clock in tests, or a store that lives
    in this process (``memory://``). Exact by definition: uncertainty and offset are 0."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def now(self) -> datetime:
        return self._clock()

    def offset_seconds(self) -> float | None:
        return 0.0

    def uncertainty_seconds(self) -> float:
        return 0.0
