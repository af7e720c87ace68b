"""The self-fence of one worker: when it is imposed, and when it may be lifted.

A worker that cannot renew its lease self-fences (docs/agent.md "Self-fencing"): it stops what
it runs, starts nothing and acknowledges nothing. Coming back is where it can go wrong: the
lease may be renewed while the fence's own stop handlers are still queued or running (an
``on_resume`` under way when the fence came runs first, then its fence handler), and while the
local copy still holds what the worker read before it was cut off. Lifting the fence at the
first renewal (as the agent once did) made a live, unfenced worker run its consumers while a
pause that settled without it read ``paused``: the protocol model's ``early_unfence`` variant
(model/README.md). So the fence is lifted only when all three hold:

1. the lease holds again: a renewal landed, and the end it gives by the monotonic clock is
   still ahead;
2. every key the fence had to stop was stopped: its ``on_fence``/``on_pause`` handlers
   returned or, for a location that disappeared (purged, or created again as a new life),
   its ``on_remove`` returned. A location's keys once left the fence as soon as its
   ``on_remove`` was *queued*, so the fence lifted while the consumers of a removed location
   still ran, and a pause of the location created again read ``paused`` (the hostile
   review's freeze-across-a-removal run; the protocol model's ``fence_remove`` finding);
3. a full re-read of the records that started after the lease came back has completed.

States: held (:attr:`Fence.reason` None) -> fenced -> returning (the lease is back, 2 or 3 still
due) -> held. The class is pure (no I/O, no clock of its own, no lock): the agent calls it under
its lock with the monotonic time, so its rules are tested on a fake clock
(tests/test_agent_parts.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from locstatus.agent.queue import Key

__all__ = ["Fence"]


class Fence:
    """The fence of one worker.

    Usage::

        fence = Fence()
        fence.impose("no renewal landed", {("us-east-1", "replication")})
        fence.stopped(("us-east-1", "replication"))   # its fence handler returned
        fence.lease_back(until=112.0, now=100.0)        # True: read everything again
        token = fence.reread_token()                    # as the re-read starts
        fence.reread_done(token)                        # once it completed
        assert fence.ready(now=101.0)
        fence.lift()
    """

    def __init__(self) -> None:
        self.reason: str | None = None
        """Why the worker is fenced, or None while it holds its lease."""
        self.to_stop: set[Key] = set()
        """Keys whose fence handlers must still return."""
        self.to_remove: set[str] = set()
        """Locations that disappeared whose ``on_remove`` must still return: it, not a fence
        handler, stops what runs there."""
        self._back_until: float | None = None
        """The lease's end (monotonic seconds) as of the last renewal since the fence; None
        while no renewal landed."""
        self._episode = 0
        """Counts fences and returns: a re-read counts only for the return it started in."""
        self._reread = False

    @property
    def fenced(self) -> bool:
        """True from :meth:`impose` until :meth:`lift`."""
        return self.reason is not None

    @property
    def returning(self) -> bool:
        """Fenced, and a renewal landed since: the lease is back (or was, see :meth:`ready`)."""
        return self.reason is not None and self._back_until is not None

    def impose(self, reason: str, keys: Iterable[Key], removals: Iterable[str] = ()) -> bool:
        """Fence for ``reason``; ``keys`` (what the worker runs) must be stopped before the
        fence lifts, and so must ``removals`` (locations that disappeared whose ``on_remove``
        is still due). False (nothing changed) when fenced already."""
        if self.reason is not None:
            return False
        self.reason = reason
        self.to_stop = set(keys)
        self.to_remove = set(removals)
        self._back_until = None
        self._reread = False
        self._episode += 1
        return True

    def stopped(self, key: Key) -> None:
        """The fence handlers of ``key`` returned: what ran there is stopped."""
        self.to_stop.discard(key)

    def gone(self, location: str, *, on_remove: bool) -> bool:
        """``location`` disappeared (purged, or created again as a new life). With
        ``on_remove`` (its ``on_remove`` is queued) its keys no longer wait for a fence
        handler but for that ``on_remove`` to return (:meth:`removed`); without, nothing of
        it runs, and its keys are dropped. True when it had keys to stop."""
        keys = {k for k in self.to_stop if k[0] == location}
        self.to_stop -= keys
        if keys and on_remove and self.reason is not None:
            self.to_remove.add(location)
        return bool(keys)

    def removed(self, location: str) -> None:
        """The ``on_remove`` handlers of ``location`` returned: nothing runs there any more."""
        self.to_remove.discard(location)
        self.to_stop = {k for k in self.to_stop if k[0] != location}

    def lease_back(self, until: float, *, now: float) -> bool:
        """A renewal landed while fenced; the lease now holds until ``until`` (monotonic
        seconds). True when this starts a return, so the records must be read again: the
        first renewal since the fence, or the first after the lease ran out again meanwhile
        (a re-read from before that no longer counts)."""
        if self.reason is None:
            return False
        new = self._back_until is None or now >= self._back_until
        if new:
            self._episode += 1
            self._reread = False
        self._back_until = until
        return new

    def reread_token(self) -> int | None:
        """Call as a full re-read of the records starts: the token to hand to
        :meth:`reread_done` once it completed, None when it does not count (not
        returning)."""
        return self._episode if self.returning else None

    def reread_done(self, token: int | None) -> None:
        """A full re-read that started with ``token`` completed."""
        if token is not None and token == self._episode and self.returning:
            self._reread = True

    def ready(self, *, now: float) -> bool:
        """Fenced, and all three conditions of the module docstring hold at ``now``."""
        return (
            self.reason is not None
            and self._back_until is not None
            and now < self._back_until
            and self._reread
            and not self.to_stop
            and not self.to_remove
        )

    def lift(self) -> None:
        """Back to held (call once :meth:`ready`)."""
        self.reason = None
        self.to_stop.clear()
        self.to_remove.clear()
        self._back_until = None
        self._reread = False
