"""When this worker tries to settle which location: debounce, settler choice, retries, sweeps.

Trying to settle costs reads of the record, the workers and every acknowledgement of the
location (on ZooKeeper one request per worker), so a fleet that all tried at once would spend
more on settling than on applying the change (docs/agent.md, "Settle"). For each (location,
service) one live worker is the *settler*: the highest rendezvous hash of location and worker
id among the live workers that apply it, so the role spreads over the fleet and moves when a
worker goes away. After acknowledging, the settler tries once no other worker has acknowledged
for ~10 ms (plus up to 20 ms of jitter), and again with backoff (capped at ``settle_interval``)
while the record stays transitional. The worker ranked second, the *backup*, falls back
:data:`SETTLE_BACKUP` seconds after its acknowledgement and retries with backoff too (the
settler may die right after acknowledging); every other worker tries once only, as a
fallback, :data:`SETTLE_FALLBACK` seconds later. Every non-settler once retried with
backoff, and in a burst (16 workers, a pause of 10 000 locations) the fleet made 585 000
settle attempts, nearly half of its CPU, each one reading the acknowledgements of the
locations tried (docs/agent.md "Bursts"). Independently, a *sweep*
tries every transitional record the worker knows when workers come and go (a crashed worker's
lapsed lease must not leave a location ``pausing`` forever), at most once per
``settle_interval``.

:class:`SettleSchedule` holds only the deadlines (monotonic seconds) and decides them; it does
no I/O and takes the time as an argument, so the rules are tested with a fake clock
(tests/test_agent_parts.py). The watch loop asks it what is due and does the settling. It is
not thread-safe: the agent calls it under its lock.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable

__all__ = [
    "SETTLE_BACKUP",
    "SETTLE_FALLBACK",
    "SETTLE_FALLBACK_CAP",
    "SETTLE_GATHER",
    "SETTLE_JITTER",
    "SETTLE_MAX_DELAY",
    "SETTLE_QUIET",
    "SETTLE_RETRIES",
    "SettleSchedule",
    "is_settler",
    "rendezvous",
    "settle_rank",
]

SETTLE_QUIET = 0.01
"""Seconds without another worker's acknowledgement before an acknowledging worker settles."""
SETTLE_JITTER = 0.02
"""Random extra delay (seconds, up to this) so the fleet's settles do not all start at once: the
first one to land moves the record out of its transitional state, and the others, having read
that, skip theirs."""
SETTLE_MAX_DELAY = 0.25
"""Upper bound (seconds after the acknowledgement) of the settle debounce."""
SETTLE_BACKUP = 0.5
"""Seconds (plus up to as much again, random) after which a location's backup (the worker
ranked second) tries to settle it if it still reads it transitional (the settler died, or is
slow), and again with backoff up to :data:`SETTLE_FALLBACK_CAP` seconds apart."""
SETTLE_FALLBACK = 2.0
"""Seconds (plus up to as much again, random) after which a worker that is neither the settler
nor the backup of a location tries, once, to settle it, if it still reads it transitional.
Long enough that after a burst's acknowledgements the local copy already shows most locations
settled (an attempt then costs no read)."""
SETTLE_FALLBACK_CAP = 5.0
"""Longest wait (seconds) between the backup's later attempts (the delay doubles)."""
SETTLE_GATHER = 0.1
"""Seconds: when one settle window is open, the watch thread also takes those opening within
this much after it, and settles them together (one batched settle, docs/agent.md "Bursts")."""
SETTLE_RETRIES = 30
"""The settler's (and the backup's) attempts after the first while the location stays
transitional (about 25 s of them for the settler with ``settle_interval`` 1 s: a burst's
slowest worker may take that long); then the safety nets (a change of the worker list, the
periodic resync, the check job, a ``wait=``) take over. No other worker retries."""


def rendezvous(location: str, worker_id: str) -> int:
    """Rendezvous (highest random weight) hash: the same ranking in every process."""
    return zlib.crc32(f"{location}\0{worker_id}".encode())


def settle_rank(location: str, worker_id: str, live: Iterable[str]) -> int:
    """``worker_id``'s place for ``location`` among ``live`` worker ids and itself (0: the
    settler, 1: the backup), by :func:`rendezvous`."""
    mine = rendezvous(location, worker_id)
    return sum(1 for w in {*live} - {worker_id} if rendezvous(location, w) > mine)


def is_settler(location: str, worker_id: str, live: Iterable[str]) -> bool:
    """True when ``worker_id`` ranks highest for ``location`` among ``live`` worker ids (itself
    always counted, even when its own registration is not visible yet)."""
    ids = {*live, worker_id}
    return max(ids, key=lambda w: rendezvous(location, w)) == worker_id


class SettleSchedule:
    """Per location, the window in which to try settling it; plus the sweep's rate limit.

    A window is ``(earliest, latest)`` monotonic seconds: it opens at ``earliest``; other
    workers' acknowledgements push ``earliest`` later (debounce) but never past ``latest``.

    Usage::

        s = SettleSchedule(settle_interval=1.0, rng=random.Random(7))
        s.acknowledged("us-east-1", settler=True, now=100.0)
        assert s.pop_due(now=100.0) == set()          # quiet period not over
        assert s.pop_due(now=100.3) == {"us-east-1"}  # past the debounce bound
    """

    def __init__(self, settle_interval: float, rng: random.Random | None = None) -> None:
        self.settle_interval = settle_interval
        self._rng = rng or random.Random()
        self._due: dict[str, tuple[float, float]] = {}
        # Locations this worker acknowledged as their settler, still transitional here, and
        # how many settle attempts each has had since.
        self._settler_of: set[str] = set()
        self._backup_of: set[str] = set()  # likewise, as their backup
        self._tries: dict[str, int] = {}
        self._want_sweep = False
        self._next_sweep = 0.0

    def _delay(self) -> float:
        return SETTLE_QUIET + self._rng.uniform(0.0, SETTLE_JITTER)

    def __len__(self) -> int:
        """Locations with an open or pending window."""
        return len(self._due)

    # -- windows --------------------------------------------------------------------------

    def acknowledged(
        self, location: str, *, settler: bool, now: float, backup: bool = False
    ) -> None:
        """This worker acknowledged a transitional state of ``location`` at ``now``: the
        settler tries after the quiet period, the ``backup`` after :data:`SETTLE_BACKUP`, any
        other worker after :data:`SETTLE_FALLBACK`."""
        self._tries.pop(location, None)
        if settler:
            self._settler_of.add(location)
            self._due[location] = (now + self._delay(), now + SETTLE_MAX_DELAY)
            return
        if backup:
            self._backup_of.add(location)
        wait = SETTLE_BACKUP if backup else SETTLE_FALLBACK
        late = now + wait + self._rng.uniform(0.0, wait)
        self._due[location] = (late, late)

    def others_acknowledged(self, location: str, *, now: float) -> None:
        """Another worker acknowledged at ``location`` (an ``acks`` hint): put this worker's
        attempt off until they are done, within its window's bound; the settler of a location
        whose window already closed gets a new one (it tries again after each later
        acknowledgement)."""
        due = self._due.get(location)
        if due is not None:
            when = min(due[1], now + self._delay())
            self._due[location] = (max(due[0], when), due[1])
        elif location in self._settler_of:
            self._due[location] = (now + self._delay(), now + SETTLE_MAX_DELAY)

    def pop_due(self, *, now: float, gather: float = 0.0) -> set[str]:
        """Remove and return the locations whose window is open at ``now``; when any is, also
        those opening within ``gather`` seconds after it, so that the windows of a burst
        (jittered apart) are tried together, in one batched settle, not a few at a time
        (their attempts come that much early: a settle's own check decides, docs/design.md
        §3)."""
        if not any(earliest <= now for earliest, _ in self._due.values()):
            return set()
        until = now + gather
        ready = {loc for loc, (earliest, _) in self._due.items() if earliest <= until}
        for loc in ready:
            del self._due[loc]
        return ready

    def retry(self, locations: Iterable[str], *, now: float) -> None:
        """The attempts for ``locations`` could not run (a backend error): open their windows
        again at once, unless they have a newer one."""
        for loc in locations:
            self._due.setdefault(loc, (now, now))

    def still_transitional(self, location: str, *, now: float) -> bool:
        """An attempt left ``location`` transitional (others still to acknowledge): its settler
        tries again, backing off (acknowledgement hints may not come). Returns True when a new
        window was opened; False when one is already pending, this worker is neither the
        location's settler nor its backup (its one fallback attempt is spent), or the retries
        are spent (the safety nets take over)."""
        settler = location in self._settler_of
        if location in self._due or not (settler or location in self._backup_of):
            return False  # a third worker's one fallback attempt is spent (module docstring)
        tries = self._tries.get(location, 0) + 1
        if tries > SETTLE_RETRIES:
            return False
        self._tries[location] = tries
        if settler:
            delay = min(self.settle_interval, SETTLE_QUIET * 2**tries)
        else:
            delay = min(SETTLE_FALLBACK_CAP, SETTLE_BACKUP * 2**tries)
        delay += self._delay()
        self._due[location] = (now + delay, now + delay)
        return True

    def settled(self, location: str) -> None:
        """Nothing is left to settle at ``location`` here (settled, or gone)."""
        self._settler_of.discard(location)
        self._backup_of.discard(location)
        self._tries.pop(location, None)

    # -- the sweep ------------------------------------------------------------------------

    def request_sweep(self) -> None:
        """Workers came or went: sweep the transitional records once the rate limit allows."""
        self._want_sweep = True

    def take_sweep(self, *, now: float) -> bool:
        """True (and the request consumed) when a requested sweep may run at ``now``."""
        if self._want_sweep and now >= self._next_sweep:
            self._want_sweep = False
            return True
        return False

    def swept(self, *, now: float) -> None:
        """A sweep starts at ``now`` (requested or not): the next one waits a full interval."""
        self._next_sweep = now + self.settle_interval

    # -- the next deadline ----------------------------------------------------------------

    def next_at(self) -> float | None:
        """The earliest monotonic time at which something here is due (a window opening, a
        requested sweep); None when nothing is pending."""
        times = [earliest for earliest, _ in self._due.values()]
        if self._want_sweep:
            times.append(self._next_sweep)
        return min(times) if times else None

    def clear(self) -> None:
        self._due.clear()
        self._settler_of.clear()
        self._backup_of.clear()
        self._tries.clear()
        self._want_sweep = False
        self._next_sweep = 0.0
