"""This process's monotonic clock: is it one, and waiting on it without ``time.sleep``.

Why it is shaped so: every ``wait=`` timeout, retry backoff and heartbeat period of locstatus is
elapsed time on the monotonic clock (docs/time.md), so it must count seconds since boot. Two
ways of running under libfaketime (Debian's ``faketime``, the way to reproduce a skewed host)
break that, and both used to show only as a hang:

- the ``faketime`` wrapper fakes ``CLOCK_MONOTONIC`` by default: it then reads the faked wall
  clock (about 1.8e9 s) instead of the time since boot, and Python passes deadlines computed on
  it to ``sem_clockwait``, which libfaketime does not intercept: every timed lock wait
  (``Event.wait(10)``, ``--wait 10``) waits for decades. :func:`check_monotonic` tells this
  apart (no machine has been up for 31 years) so the CLI refuses with the fix instead;
- with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` (only the wall clock off, as on a real host)
  libfaketime 0.9.10 makes Python 3.11's ``time.sleep`` fail with EINVAL (it shifts the
  absolute ``clock_nanosleep`` deadline). :func:`sleep` waits on an event instead, which works
  there, so locstatus's own waits never call ``time.sleep``.
"""

from __future__ import annotations

import threading
import time

from locstatus.errors import LocstatusError

__all__ = ["FAKED_ABOVE", "FakedMonotonic", "check_monotonic", "sleep"]

FAKED_ABOVE = 1e9
"""A monotonic reading above this many seconds (31 years since boot) is a wall-clock time."""


class FakedMonotonic(LocstatusError):
    """This process's monotonic clock reads like a wall clock (exit code 2)."""

    exit_code = 2


def check_monotonic() -> None:
    """Raise :class:`FakedMonotonic` when ``time.monotonic()`` is not a time since boot
    (libfaketime faking ``CLOCK_MONOTONIC``; docs/time.md, "Reproducing a skewed host"), naming
    the reading and the fix. Returns None on a real monotonic clock."""
    reading = time.monotonic()
    if reading >= FAKED_ABOVE:
        raise FakedMonotonic(
            f"this process's monotonic clock reads {reading:.0f} s, a wall-clock time, not a "
            "time since boot: libfaketime is faking CLOCK_MONOTONIC (the faketime wrapper does "
            "by default), and every timed wait would hang; set FAKETIME_DONT_FAKE_MONOTONIC=1 "
            "to fake the wall clock only (docs/time.md, \"Reproducing a skewed host\")"
        )


def sleep(seconds: float) -> None:
    """Wait ``seconds`` (>= 0) on the monotonic clock, as ``time.sleep`` does, through a timed
    event wait (``time.sleep`` fails under libfaketime with the monotonic clock left real).
    Raises ``ValueError`` for a negative length, as ``time.sleep`` does."""
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(seconds)
