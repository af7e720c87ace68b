"""The measuring time source: the backend's time, read in one round trip and carried forward on
this process's monotonic clock (docs/time.md).

Why it is shaped so:

- **A probe** asks the store for its own time (:meth:`Backend.probe_time`: the kernel's stamp of
  a write beside a SQLite file, the ``mtime`` ZooKeeper's leader stamps on a write, MongoDB's
  ``localTime``). The stamp was taken somewhere between sending and receiving, so at the
  middle of the round trip the backend's time is the stamp, give or take half the round trip
  (plus the stamp's resolution).
- **Between probes** ``now() = stamp + (monotonic() - middle)``. This host's wall clock is never
  used for a decision; it is read only to report the offset (wall clock minus backend time).
- **The bound grows with age**: the monotonic clock and the backend's clock may tick at
  slightly different rates (NTP slews a clock by at most 500 ppm), so an estimate's uncertainty
  is ``rtt/2 + resolution + DRIFT * age`` with ``DRIFT`` twice that rate, both clocks counted.
- **Re-probing** happens when the last attempt is older than ``probe_interval``, and when a
  decision needs it: a deadline inside the uncertainty, or an uncertainty above the bound (a
  slow round trip). Those extra probes are at most one per ``REPROBE_AFTER`` seconds, so a hot
  path never probes once per operation. A better (tighter) estimate is never replaced by a
  worse one. Probes are serialised; a thread that finds another one probing goes on with the
  current estimate.
- **Refusal**: while the uncertainty is above ``max_uncertainty`` (or no probe ever answered),
  :meth:`BackendClock.is_past` answers False for every deadline: nothing is settled without a
  worker, expired, purged or fired. Each refusal is counted, logged (once per change of
  reason) and described by :meth:`BackendClock.problem` for the check job and the metrics.

Usage::

    from locstatus.backends import open_backend
    backend = open_backend("zk://127.0.0.1:2181/locstatus")
    time_source = BackendClock(backend, probe_interval=5, max_uncertainty=0.25)
    time_source.now()                  # the ensemble's time, aware UTC
    time_source.offset_seconds()       # this host's wall clock minus it
    time_source.is_past(lease_expires_at)
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from locstatus.backends.base import Backend
from locstatus.clock import CallerClock, TimeSource
from locstatus.errors import BackendUnavailable, InvalidInput, LocstatusError
from locstatus.models import utcnow

log = logging.getLogger("locstatus.clock")

DEFAULT_PROBE_INTERVAL = 5.0
"""Seconds between probes of the backend's time (``LOCSTATUS_CLOCK_PROBE_INTERVAL``)."""

DEFAULT_MAX_UNCERTAINTY = 0.25
"""Seconds: above this uncertainty no deadline is acted on (``LOCSTATUS_CLOCK_MAX_UNCERTAINTY``)."""

DRIFT = 1e-3
"""Seconds of uncertainty added per second of an estimate's age: 1000 ppm, twice the fastest
rate at which NTP slews a clock, so it covers this host's monotonic clock and the backend's
clock drifting apart in opposite directions."""

REPROBE_AFTER = 0.1
"""Seconds: the least time between two probes made because a decision needs a tighter bound."""

TIGHT_PROBES = 3
"""Probes tried in a row when the uncertainty is above the bound (a slow round trip under load
is often followed by a fast one); the tightest estimate is kept."""


@dataclass(frozen=True)
class _Estimate:
    """One probe: the backend's time ``at`` the local monotonic instant ``mono`` (the middle of
    the round trip), within ``half_rtt + resolution`` then; ``offset`` is this host's wall clock
    minus the backend's time (seconds)."""

    at: datetime
    mono: float
    half_rtt: float
    resolution: float
    offset: float

    def now(self, mono: float) -> datetime:
        return self.at + timedelta(seconds=mono - self.mono)

    def uncertainty(self, mono: float) -> float:
        return self.half_rtt + self.resolution + DRIFT * max(0.0, mono - self.mono)


class BackendClock(TimeSource):
    """The backend's time as this process measures it (see the module docstring).

    - ``backend``: the store whose :meth:`~locstatus.backends.base.Backend.probe_time` is read.
    - ``probe_interval``: seconds between probes (> 0).
    - ``max_uncertainty``: seconds; deadlines are refused above it (> 0).
    - ``monotonic`` / ``wall``: clocks in seconds (tests replace them); ``wall`` is only read to
      report the offset.

    :meth:`now` raises :class:`BackendUnavailable` only while no probe has ever answered;
    afterwards it carries the last estimate forward (with a growing uncertainty) whatever the
    backend does. Thread-safe.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        probe_interval: float = DEFAULT_PROBE_INTERVAL,
        max_uncertainty: float = DEFAULT_MAX_UNCERTAINTY,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        for name, value in (("probe_interval", probe_interval),
                            ("max_uncertainty", max_uncertainty)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise InvalidInput(f"clock {name} must be a positive number of seconds, "
                                   f"got {value!r}")
        self.backend = backend
        self.probe_interval = float(probe_interval)
        self._max = float(max_uncertainty)
        self._mono = monotonic
        self._wall = wall
        self._est: _Estimate | None = None
        self._last_attempt = -math.inf
        self._probing = threading.Lock()
        self._count_lock = threading.Lock()
        self._refusals = 0
        self._problem: str | None = None
        self._logged: str | None = None
        self.probes = 0
        """Probes that answered."""
        self.probe_errors = 0
        """Probes that failed (the backend did not answer)."""
        self.last_error: str | None = None
        """The message of the last failed probe, None after a good one."""

    # -- the contract ------------------------------------------------------------------------

    def now(self) -> datetime:
        est = self._current()
        if est is None:
            raise BackendUnavailable(
                f"cannot read the time of {self.backend.url}: {self.last_error or 'no answer'}"
            )
        return est.now(self._mono())

    def offset_seconds(self) -> float | None:
        """As last measured (no probe: reporting never waits for the backend)."""
        est = self._est
        return None if est is None else est.offset

    def uncertainty_seconds(self) -> float:
        """Of the current estimate (no probe); infinite while nothing was ever measured."""
        est = self._est
        return math.inf if est is None else est.uncertainty(self._mono())

    @property
    def max_uncertainty_seconds(self) -> float:
        return self._max

    @property
    def refusals(self) -> int:
        return self._refusals

    def problem(self) -> str | None:
        est = self._est
        if est is None:
            return self._problem
        unc = est.uncertainty(self._mono())
        if unc > self._max:
            return self._too_uncertain(unc, est)
        return None

    def is_past(self, deadline: datetime) -> bool:
        """True only when ``deadline`` passed by the backend's time even at the worst end of
        the bound; False (refused, counted) while the bound cannot be met."""
        est = self._current()
        if est is None:
            return self._refuse(self._problem or "backend time unknown")
        mono = self._mono()
        unc = est.uncertainty(mono)
        if est.now(mono) + timedelta(seconds=unc) < deadline:
            return False  # not yet, whatever the error: nothing to refuse
        if unc > self._max:
            est = self._tighten(TIGHT_PROBES) or est
            mono = self._mono()
            unc = est.uncertainty(mono)
            if unc > self._max:
                return self._refuse(self._too_uncertain(unc, est))
        self._recovered()
        if est.now(mono) - timedelta(seconds=unc) >= deadline:
            return True
        est = self._tighten(1) or est  # inside the bound: a fresh probe may decide it
        mono = self._mono()
        unc = est.uncertainty(mono)
        if unc > self._max:
            return self._refuse(self._too_uncertain(unc, est))
        return est.now(mono) - timedelta(seconds=unc) >= deadline

    # -- probing -----------------------------------------------------------------------------

    def probe(self) -> None:
        """Measure now (blocking while another thread measures). Raises
        :class:`BackendUnavailable` when the backend does not answer."""
        with self._probing:
            self._measure()

    def _current(self) -> _Estimate | None:
        """The estimate, probed first when there is none or the last attempt is old."""
        est = self._est
        if est is None:
            with self._probing:  # nothing to go on: wait for (or make) the first probe
                if self._est is None:
                    self._measure_quietly()
            return self._est
        if self._mono() - self._last_attempt >= self.probe_interval and self._probing.acquire(
            blocking=False
        ):
            try:
                if self._mono() - self._last_attempt >= self.probe_interval:
                    self._measure_quietly()
            finally:
                self._probing.release()
        return self._est

    def _tighten(self, tries: int) -> _Estimate | None:
        """Up to ``tries`` probes for a tighter bound, unless one was made in the last
        :data:`REPROBE_AFTER` seconds or another thread is probing."""
        if self._mono() - self._last_attempt < REPROBE_AFTER:
            return self._est
        if not self._probing.acquire(blocking=False):
            return self._est
        try:
            for _ in range(tries):
                if not self._measure_quietly():
                    break
                est = self._est
                if est is not None and est.uncertainty(self._mono()) <= self._max:
                    break
        finally:
            self._probing.release()
        return self._est

    def _measure_quietly(self) -> bool:
        try:
            self._measure()
        except LocstatusError as exc:
            self.probe_errors += 1
            self.last_error = exc.message
            self._problem = f"backend time unknown: {exc.message}"
            self._log(f"cannot read the backend's time: {exc.message}")
            return False
        return True

    def _measure(self) -> None:
        """One probe (caller holds ``_probing``). Keeps the tighter of the new and the current
        estimate."""
        self._last_attempt = self._mono()
        w0, m0 = self._wall(), self._mono()
        stamp = self.backend.probe_time()
        m1, w1 = self._mono(), self._wall()
        if stamp.tzinfo is None:  # a backend bug: never guess a zone
            raise BackendUnavailable(f"{self.backend.url} reported a naive time {stamp!r}")
        self._last_attempt = m1
        new = _Estimate(
            at=stamp,
            mono=(m0 + m1) / 2,
            half_rtt=max(0.0, m1 - m0) / 2,
            resolution=float(self.backend.clock_resolution),
            offset=(w0 + w1) / 2 - stamp.timestamp(),
        )
        old = self._est
        if old is None or new.uncertainty(m1) <= old.uncertainty(m1):
            self._est = new
        else:  # keep the tighter estimate, but report the latest offset
            self._est = _Estimate(old.at, old.mono, old.half_rtt, old.resolution, new.offset)
        self.probes += 1
        self.last_error = None
        self._problem = None

    # -- saying so ---------------------------------------------------------------------------

    def _too_uncertain(self, unc: float, est: _Estimate) -> str:
        return (
            f"backend time uncertain by {unc:.3f}s, above the {self._max:g}s bound "
            f"(last probe round trip {2 * est.half_rtt:.3f}s"
            + (f"; last probe failed: {self.last_error}" if self.last_error else "")
            + ")"
        )

    def _refuse(self, why: str) -> bool:
        with self._count_lock:
            self._refusals += 1
        self._log(f"refusing to act on a deadline: {why} (docs/time.md)")
        return False

    def _recovered(self) -> None:
        if self._logged is not None:
            self._logged = None
            log.warning("backend time of %s known again within %gs: acting on deadlines again",
                        self.backend.url, self._max)

    def _log(self, message: str) -> None:
        kind = message.split(":", 1)[0]
        if self._logged != kind:  # once per change of reason, not once per decision
            self._logged = kind
            log.warning("%s: %s", self.backend.url, message)


def time_source_for(
    backend: Backend,
    *,
    probe_interval: float = DEFAULT_PROBE_INTERVAL,
    max_uncertainty: float = DEFAULT_MAX_UNCERTAINTY,
) -> TimeSource:
    """The time source a manager over ``backend`` judges deadlines on: the exact
    :class:`CallerClock` for a store that lives in this process (``memory://``), else a
    :class:`BackendClock` measuring the store's own time."""
    if backend.local_clock:
        return CallerClock(utcnow)
    return BackendClock(backend, probe_interval=probe_interval, max_uncertainty=max_uncertainty)


__all__ = [
    "DEFAULT_MAX_UNCERTAINTY",
    "DEFAULT_PROBE_INTERVAL",
    "BackendClock",
    "time_source_for",
]
