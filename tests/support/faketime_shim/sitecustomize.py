"""Imported at start-up by every Python process the skew tests run under libfaketime.

The tests fake only the wall clock (``FAKETIME_DONT_FAKE_MONOTONIC=1``): a host whose clock is
off still has a monotonic clock that counts seconds. With Debian's libfaketime 0.9.10 and
Python 3.11 that leaves one call broken: ``time.sleep`` (``clock_nanosleep`` on an absolute
CLOCK_MONOTONIC deadline, which libfaketime shifts by the fake offset) fails with EINVAL. It is
replaced here by a ``select`` wait, which libfaketime leaves alone. (Faking the monotonic clock
as well is no way out: every timed lock wait then hangs, Python passing a faked deadline to
``sem_clockwait``, which libfaketime does not intercept.) Nothing else changes; outside
libfaketime (no ``FAKETIME`` in the environment) this module does nothing.

locstatus itself does not need it (its waits go through ``locstatus.monotonic.sleep``): it is
for the code in the faked processes that locstatus does not own, the test worker's handlers,
kazoo's retries and pymongo's server monitors (docs/time.md, "Reproducing a skewed host").
"""

from __future__ import annotations

import os

if os.environ.get("FAKETIME"):
    import select
    import time

    def _sleep(seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        select.select([], [], [], seconds)

    time.sleep = _sleep
