"""The heartbeat thread: renew the lease, impose and lift the self-fence.

The heartbeat must never wait behind a slow handler, so it is a thread of its own. Each pass
renews the lease (:meth:`Lease.renew`, never raises) and draws the consequences
(docs/agent.md "Leases", "Self-fencing"):

- the lease ran out by the worker's own monotonic clock before this renewal was known to have
  landed: self-fence (the guard does the same when no renewal comes back at all);
- the renewal succeeded while fenced and the lease now holds again: start coming back (read
  every record again); the fence lifts once its handlers returned and that re-read completed
  (:mod:`.fence`), here or in the thread that completes the last of them;
- it succeeded but leaves the lease less than a heartbeat (it was sent long before it
  landed: a server frozen and thawed): renew again at once; the worker comes back only on a
  renewal sent after the fence that holds until the next one is due;
- it succeeded after a failure or after the lease lapsed: re-read everything (notifications
  may have been missed) and, after a lapse, acknowledge again what was applied (the worker may
  have been dropped as expired, and its acknowledgements with it).
"""

from __future__ import annotations

import logging

from locstatus.agent.lease import Lease
from locstatus.agent.state import AgentState

__all__ = ["Heartbeat"]

log = logging.getLogger("locstatus.agent")


class Heartbeat:
    """Renews ``lease`` every ``interval`` seconds (or at once when ``state.beat_now`` is
    set: an error or a stuck handler to publish, a fence to lift) for one worker."""

    def __init__(self, state: AgentState, lease: Lease, worker_id: str, *, interval: float):
        self.state = state
        self.lease = lease
        self.worker_id = worker_id
        self.interval = interval
        self.fenced_at = float("-inf")
        """Monotonic time the last self-fence was imposed."""

    def run(self) -> None:
        """The heartbeat loop, until the agent stops."""
        s = self.state
        while not s.stopping.is_set():
            s.beat_now.wait(self.interval)
            s.beat_now.clear()
            if s.stopping.is_set():
                return
            self.beat()

    def lease_until(self) -> float | None:
        """When the lease ends by the monotonic clock (None: fenced already), for the guard."""
        return None if self.state.fence.fenced else self.lease.good_until

    def fence(self, reason: str) -> None:
        """Self-fence (see :meth:`AgentState.fence_locked`)."""
        s = self.state
        with s.cond:
            newly = s.fence_locked(reason)
            if newly:
                self.fenced_at = s.monotonic()
        if newly:
            log.warning("agent %s: self-fenced: %s", self.worker_id, reason)
            s.beat_now.set()  # try to renew at once

    def beat(self) -> None:
        """One renewal and its consequences (see the module docstring)."""
        s = self.state
        held_until = self.lease.good_until
        with s.lock:
            errors, stuck = dict(s.errors), s.stuck_locked()
        renewal = self.lease.renew(errors, stuck)
        now = s.monotonic()
        if held_until is not None and now >= held_until:
            self.fence("the lease ran out before a renewal landed")
        with s.lock:
            if not renewal.ok:
                s.metrics["heartbeat_errors"] += 1
                return
            s.metrics["heartbeats"] += 1
            until = self.lease.good_until
            # A renewal that landed late (sent before a freeze, answered after the thaw) wrote
            # a lease dated when it was sent: it may hold for less than a heartbeat. Renew at
            # once; and come back only on a renewal sent after the fence, holding until the
            # next one is due (coming back on the late one, the worker ran on_resume and
            # fenced again a moment later: docs/agent.md "Self-fencing").
            short = until is not None and until - now < self.interval
            if short:
                s.beat_now.set()
            fresh = self.lease.last_sent >= self.fenced_at and not short
            lifted = False
            if s.fence.fenced and until is not None and now < until and fresh:
                if not s.fence.returning:
                    log.warning(
                        "agent %s: lease renewed: coming back once the fence's handlers "
                        "returned and every record was read again",
                        self.worker_id,
                    )
                lifted = s.lease_back_locked(until)
            if renewal.reconnected:
                s.metrics["reconnects"] += 1
                s.want_resync = True
            if renewal.lapsed:
                s.metrics["lease_lapses"] += 1
            if renewal.lapsed or renewal.reregistered:
                s.copy.acknowledge_again()
        if lifted:
            log.warning("agent %s: fence lifted, re-applying", self.worker_id)
        if renewal.reconnected:
            s.wake.set()
